// Workgroup reductions through subgroup operations and one shared slot per subgroup
// (norm_vec.wgsl, softmax_vec.wgsl; devices with subgroup arithmetic). Constant: WG.

// One partial per subgroup.
var<workgroup> partial: array<vec2<f32>, WG>;

// The workgroup's sums of v (every invocation gets them).
fn wg_sum(v: vec2<f32>, sg: u32, sg_lane: u32, subgroups: u32) -> vec2<f32> {
    let s = subgroupAdd(v);
    if (sg_lane == 0u) {
        partial[sg] = s;
    }
    workgroupBarrier();
    var t = vec2<f32>(0.0);
    for (var i = 0u; i < subgroups; i++) {
        t += partial[i];
    }
    workgroupBarrier();
    return t;
}

// The workgroup's max of v, NaN if any invocation's v is NaN (subgroupMax need not keep NaN,
// so NaNs are counted apart).
fn wg_max_nan(v: f32, sg: u32, sg_lane: u32, subgroups: u32) -> f32 {
    let nan = is_nan(v);
    let m = subgroupMax(select(v, neg_inf(), nan));
    let count = subgroupAdd(select(0.0, 1.0, nan));
    if (sg_lane == 0u) {
        partial[sg] = vec2<f32>(m, count);
    }
    workgroupBarrier();
    var t = vec2<f32>(neg_inf(), 0.0);
    for (var i = 0u; i < subgroups; i++) {
        t = vec2<f32>(max(t.x, partial[i].x), t.y + partial[i].y);
    }
    workgroupBarrier();
    return select(t.x, bitcast<f32>(0x7FC00000u), t.y > 0.0);
}
