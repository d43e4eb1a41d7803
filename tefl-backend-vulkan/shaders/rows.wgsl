// Workgroup reductions and the row blocking of the row-wise shaders (softmax, norms).
//
// A workgroup owns RPG consecutive rows (RPG = 2 when a 16-bit row has an odd length, so the
// block starts and ends on a 32-bit word and no word is written by two workgroups; else 1).
// Reductions go through `red` in shared memory.

var<workgroup> red: array<f32, WG>;

fn reduce_sum(v: f32, lane: u32) -> f32 {
    red[lane] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            red[lane] = red[lane] + red[lane + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_max(v: f32, lane: u32) -> f32 {
    red[lane] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            red[lane] = max_nan(red[lane], red[lane + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}
