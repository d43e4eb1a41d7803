// The push constants and masks of the softmax shaders (softmax.wgsl and softmax_vec.wgsl; each
// binds the byte mask tensor as `maskt`, binding 2).

struct Params {
    // 0 forward, 1 backward.
    stage: u32,
    mask: u32,
    rows: u32,
    sq: u32,
    sk: u32,
    h: u32,
    mask_batch: u32,
    // Rows per workgroup (1 or 2).
    rpg: u32,
    scale: f32,
}

var<immediate> p: Params;

// Whether entry (row, j) is masked out.
fn masked(row: u32, j: u32) -> bool {
    let i = row % p.sq;
    switch p.mask {
        case 1u: {
            let b = select(row / (p.h * p.sq), 0u, p.mask_batch == 1u);
            let k = (b * p.sq + i) * p.sk + j;
            return byte_at(maskt[k >> 2u], k) != 0u;
        }
        case 2u: {
            return j > i;
        }
        case 3u: {
            return j + p.sq > i + p.sk;
        }
        default: {
            return false;
        }
    }
}

