// Multi-tensor optimizers, in place: one dispatch per tensor of a list, all in one submission.
// Stage 0 snapshots the noop flag into ws[0] first, so a dispatch that sets the flag does not
// stop the others (the reference's semantics); every later stage returns when the snapshot is
// set. Dtypes are push constants (t0: the first list, t1: the second). Constant: WG.
// Stages: 1 scale, 2 l2-norm partial sums (PARTS workgroups per tensor, f32 partials in ws),
// 3 l2-norm finish, 4 Adam (master: model params cast from f32 masters), 5 SGD, 6 FP8 scales.

struct Params {
    stage: u32,
    n: u32,
    t0: u32,
    t1: u32,
    tensor: u32,
    ntensors: u32,
    parts: u32,
    mode: u32,
    master: u32,
    nesterov: u32,
    first_run: u32,
    wd_after_momentum: u32,
    per_tensor: u32,
    force_pow_2: u32,
    has_inv_scale: u32,
    scale: f32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    wd: f32,
    bc1: f32,
    bc2: f32,
    momentum: f32,
    dampening: f32,
    fp8_max: f32,
}

@group(0) @binding(0) var<storage, read_write> a0: array<u32>;
@group(0) @binding(1) var<storage, read_write> a1: array<u32>;
@group(0) @binding(2) var<storage, read_write> a2: array<u32>;
@group(0) @binding(3) var<storage, read_write> a3: array<u32>;
@group(0) @binding(4) var<storage, read_write> a4: array<u32>;
@group(0) @binding(5) var<storage, read_write> noop: array<atomic<i32>>;
@group(0) @binding(6) var<storage, read_write> ws: array<u32>;
@group(0) @binding(7) var<storage, read> inv_scale: array<f32>;
var<immediate> p: Params;

fn finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7F800000u) != 0x7F800000u;
}

fn f32_at(i: u32, which: u32) -> f32 {
    switch which {
        case 2u: {
            return bitcast<f32>(a2[i]);
        }
        case 3u: {
            return bitcast<f32>(a3[i]);
        }
        default: {
            return bitcast<f32>(a4[i]);
        }
    }
}

fn set_f32(i: u32, which: u32, v: f32) {
    switch which {
        case 2u: {
            a2[i] = bitcast<u32>(v);
        }
        case 3u: {
            a3[i] = bitcast<u32>(v);
        }
        default: {
            a4[i] = bitcast<u32>(v);
        }
    }
}

fn ld0(i: u32) -> f32 {
    return unpack(a0[word_of(i, p.t0)], i, p.t0);
}

fn ld1(i: u32) -> f32 {
    return unpack(a1[word_of(i, p.t1)], i, p.t1);
}

// New value of element i of the second list (the params, or dst) for stages 1, 4 and 5.
fn update(i: u32) -> f32 {
    switch p.stage {
        case 1u: {
            let v = ld0(i);
            if (!finite(v)) {
                atomicMax(&noop[0], 1);
            }
            return v * p.scale;
        }
        case 4u: {
            // (grads, params, m, v) or (grads, model, master, m, v).
            var pv = 0.0;
            var mi = 2u;
            if (p.master != 0u) {
                pv = f32_at(i, 2u);
                mi = 3u;
            } else {
                pv = ld1(i);
            }
            var gv = ld0(i);
            if (p.mode == 0u) {
                gv += p.wd * pv;
            }
            let mv = p.beta1 * f32_at(i, mi) + (1.0 - p.beta1) * gv;
            let vv = p.beta2 * f32_at(i, mi + 1u) + (1.0 - p.beta2) * gv * gv;
            set_f32(i, mi, mv);
            set_f32(i, mi + 1u, vv);
            var upd = (mv / p.bc1) / (sqrt(vv / p.bc2) + p.eps);
            if (p.mode == 1u) {
                upd += p.wd * pv;
            }
            let np = pv - p.lr * upd;
            if (p.master != 0u) {
                set_f32(i, 2u, np);
            }
            return np;
        }
        default: {
            // SGD on (grads, params, momentum buffer).
            let pv = ld1(i);
            var gv = ld0(i) * p.scale;
            if (p.wd != 0.0 && p.wd_after_momentum == 0u) {
                gv += p.wd * pv;
            }
            if (p.momentum != 0.0) {
                var b = gv;
                if (p.first_run == 0u) {
                    b = p.momentum * f32_at(i, 2u) + (1.0 - p.dampening) * gv;
                }
                set_f32(i, 2u, b);
                gv = select(b, gv + p.momentum * b, p.nesterov != 0u);
            }
            if (p.wd != 0.0 && p.wd_after_momentum != 0u) {
                gv += p.wd * pv;
            }
            return pv - p.lr * gv;
        }
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let stride = groups.x * WG;
    if (p.stage == 0u) {
        if (gid.x == 0u) {
            ws[0] = u32(atomicLoad(&noop[0]));
        }
        return;
    }
    let snapped = ws[0] != 0u;
    switch p.stage {
        case 2u: {
            // Partial Σ (x·factor)² of this workgroup into ws[1 + tensor·parts + group].
            var s = 0.0;
            if (!snapped) {
                var factor = 1.0;
                if (p.has_inv_scale != 0u) {
                    factor = inv_scale[0];
                }
                var bad = false;
                for (var i = gid.x; i < p.n; i += stride) {
                    let y = ld0(i) * factor;
                    bad = bad || !finite(y);
                    s += y * y;
                }
                if (bad) {
                    atomicMax(&noop[0], 1);
                }
            }
            s = reduce_sum(s, lane);
            if (lane == 0u) {
                ws[1u + p.tensor * p.parts + group.x] = bitcast<u32>(s);
            }
        }
        case 3u: {
            // One workgroup: per-tensor norms into a1 (when asked), the total into a0[0].
            var all = 0.0;
            for (var t = lane; t < p.ntensors; t += WG) {
                var s = 0.0;
                for (var q = 0u; q < p.parts; q++) {
                    s += bitcast<f32>(ws[1u + t * p.parts + q]);
                }
                all += s;
                if (p.per_tensor != 0u) {
                    a1[t] = bitcast<u32>(select(sqrt(s), 0.0, snapped));
                }
            }
            all = reduce_sum(all, lane);
            if (lane == 0u) {
                a0[0] = bitcast<u32>(select(sqrt(all), 0.0, snapped));
            }
        }
        case 6u: {
            // (amax, scale, scale_inv) f32 lists: a0, a2, a3.
            if (snapped) {
                return;
            }
            for (var i = gid.x; i < p.n; i += stride) {
                let a = bitcast<f32>(a0[i]);
                if (finite(a)) {
                    var s = p.fp8_max / max(a, p.eps);
                    if (p.force_pow_2 != 0u && finite(s) && s > 0.0) {
                        // The power of two at or below s (exact on the exponent bits).
                        s = bitcast<f32>(bitcast<u32>(s) & 0x7F800000u);
                    }
                    if (finite(s) && s > 0.0) {
                        a2[i] = bitcast<u32>(s);
                    }
                }
                a3[i] = bitcast<u32>(1.0 / bitcast<f32>(a2[i]));
            }
        }
        default: {
            // Stages 1, 4, 5: one word of the second list per invocation.
            if (snapped) {
                return;
            }
            let per = per_word(p.t1);
            let words = (p.n + per - 1u) / per;
            for (var w = gid.x; w < words; w += stride) {
                let i = w * per;
                let lo = update(i);
                var hi = 0.0;
                if (per == 2u && i + 1u < p.n) {
                    hi = update(i + 1u);
                }
                a1[w] = pack(lo, hi, p.t1);
            }
        }
    }
}
