//! Flash-style attention on the CPU: queries in blocks, keys in tiles, online softmax. No
//! sq×sk buffer is ever allocated; the backward recomputes the probabilities from
//! `softmax_lse` tile by tile.

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::philox::uniform;
use tefl_core::{DType, KernelCtx, Result, Tensor};

use crate::util::{store, view};

const BQ: usize = 32;
const BK: usize = 64;

/// (sequence, head, first row, values, second values) computed by one task.
type Block = (usize, usize, usize, Vec<f32>, Vec<f32>);

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// What the forward and backward share: inputs as f32, geometry, dropout.
struct Ctx<'a> {
    g: AttnGeometry,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    mask: AttnMask,
    window: AttnWindow,
    scale: f32,
    p: f32,
    seed: u64,
    offset: u64,
}

impl Ctx<'_> {
    fn q_at(&self, b: usize, i: usize, h: usize) -> usize {
        (self.g.row(false, b, i) * self.g.hq + h) * self.g.d
    }
    fn k_at(&self, b: usize, j: usize, hk: usize) -> usize {
        (self.g.row(true, b, j) * self.g.hk + hk) * self.g.d
    }
    /// The dropout factor of probability (b, h, i, j): 0 or 1/(1 − p).
    #[inline]
    fn keep(&self, b: usize, h: usize, i: usize, j: usize) -> f32 {
        if self.p == 0.0 {
            return 1.0;
        }
        let idx = (((b * self.g.hq + h) * self.g.sq + i) * self.g.sk + j) as u64;
        if uniform(self.seed, self.offset, idx) >= self.p { 1.0 / (1.0 - self.p) } else { 0.0 }
    }
}

/// The [`Ctx`] of a forward or backward call (both argument structs share these fields).
macro_rules! attn_ctx {
    ($a:ident, $op:literal, $qv:ident, $kv:ident, $vv:ident) => {
        Ctx {
            g: attn_geometry(
                $op,
                &$a.q,
                &$a.k,
                &$a.v,
                $a.cu_seqlens_q.as_ref(),
                $a.cu_seqlens_kv.as_ref(),
                $a.layout,
                $a.mask,
            )?,
            q: &$qv,
            k: &$kv,
            v: &$vv,
            mask: $a.mask,
            window: $a.window,
            scale: $a.scale,
            p: $a.dropout_p,
            seed: $a.seed,
            offset: $a.offset,
        }
    };
}

/// The catalogue op `fused_attn_fwd` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn fused_attn_fwd(_: &KernelCtx<'_>, a: &AttnFwdArgs) -> Result<AttnFwdOut> {
    let (qv, kv, vv) = (view(&a.q)?, view(&a.k)?, view(&a.v)?);
    let c = attn_ctx!(a, "fused_attn_fwd", qv, kv, vv);
    let (d, group) = (c.g.d, c.g.hq / c.g.hk);
    let mut tasks = Vec::new();
    for b in 0..c.g.batch {
        for h in 0..c.g.hq {
            for i0 in (0..c.g.q_spans[b].len).step_by(BQ) {
                tasks.push((b, h, i0));
            }
        }
    }
    let blocks: Vec<Block> = tasks
        .par_iter()
        .map(|&(b, h, i0)| {
            let i1 = (i0 + BQ).min(c.g.q_spans[b].len);
            let rows = i1 - i0;
            let hk = h / group;
            let mut acc = vec![0.0f32; rows * d];
            let mut m = vec![f32::NEG_INFINITY; rows];
            let mut l = vec![0.0f32; rows];
            let mut s = vec![f32::NEG_INFINITY; rows * BK];
            let ranges: Vec<(usize, usize)> = (i0..i1).map(|i| c.g.key_range(c.mask, c.window, b, i)).collect();
            let lo = ranges.iter().filter(|r| r.1 > r.0).map(|r| r.0).min().unwrap_or(0);
            let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
            for j0 in (lo..hi).step_by(BK) {
                let j1 = (j0 + BK).min(hi);
                for (r, &(klo, khi)) in ranges.iter().enumerate() {
                    let qi = &c.q[c.q_at(b, i0 + r, h)..][..d];
                    let srow = &mut s[r * BK..(r + 1) * BK];
                    for j in j0..j1 {
                        srow[j - j0] = if j >= klo && j < khi {
                            c.scale * dot(qi, &c.k[c.k_at(b, j, hk)..][..d])
                        } else {
                            f32::NEG_INFINITY
                        };
                    }
                    // NaN-propagating maxima: a NaN score (NaN in q or k) must reach the output,
                    // not be dropped as `f32::max` drops it (which read as a fully masked row).
                    let tile_max = srow[..j1 - j0].iter().copied().fold(f32::NEG_INFINITY, nan_max);
                    if tile_max == f32::NEG_INFINITY {
                        continue;
                    }
                    let m_new = nan_max(m[r], tile_max);
                    let corr = (m[r] - m_new).exp();
                    l[r] *= corr;
                    let ar = &mut acc[r * d..(r + 1) * d];
                    ar.iter_mut().for_each(|x| *x *= corr);
                    for j in j0..j1 {
                        let sv = srow[j - j0];
                        if sv == f32::NEG_INFINITY {
                            continue;
                        }
                        let pj = (sv - m_new).exp();
                        l[r] += pj;
                        let w = pj * c.keep(b, h, i0 + r, j);
                        if w != 0.0 {
                            let vj = &c.v[c.k_at(b, j, hk)..][..d];
                            ar.iter_mut().zip(vj).for_each(|(x, y)| *x += w * y);
                        }
                    }
                    m[r] = m_new;
                }
            }
            let mut lse = vec![f32::NEG_INFINITY; rows];
            for r in 0..rows {
                if l[r] > 0.0 || l[r].is_nan() {
                    let inv = 1.0 / l[r];
                    acc[r * d..(r + 1) * d].iter_mut().for_each(|x| *x *= inv);
                    lse[r] = m[r] + l[r].ln();
                }
            }
            (b, h, i0, acc, lse)
        })
        .collect();
    let mut o = vec![0.0f32; c.q.len()];
    let mut lse = vec![f32::NEG_INFINITY; c.g.lse_shape().iter().product()];
    for (b, h, i0, acc, l) in blocks {
        for (r, lv) in l.iter().enumerate() {
            let at = c.q_at(b, i0 + r, h);
            o[at..at + d].copy_from_slice(&acc[r * d..(r + 1) * d]);
            lse[c.g.lse_index(b, h, i0 + r)] = *lv;
        }
    }
    let lse_shape = c.g.lse_shape();
    Ok(AttnFwdOut {
        o: store(&o, a.q.shape(), a.q.dtype())?,
        softmax_lse: Tensor::from_slice(&lse, lse_shape, DType::F32)?,
    })
}

/// The larger of two scores, NaN when either is NaN.
fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() { f32::NAN } else { a.max(b) }
}

/// The catalogue op `fused_attn_bwd` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn fused_attn_bwd(_: &KernelCtx<'_>, a: &AttnBwdArgs) -> Result<AttnBwdOut> {
    let (qv, kv, vv) = (view(&a.q)?, view(&a.k)?, view(&a.v)?);
    let (ov, dov, lsev) = (view(&a.o)?, view(&a.d_o)?, view(&a.softmax_lse)?);
    let c = attn_ctx!(a, "fused_attn_bwd", qv, kv, vv);
    let (d, group) = (c.g.d, c.g.hq / c.g.hk);
    // D_i = Σ dO·O per (query row, head), indexed like lse.
    let mut delta = vec![0.0f32; lsev.len()];
    for b in 0..c.g.batch {
        for h in 0..c.g.hq {
            for i in 0..c.g.q_spans[b].len {
                let at = c.q_at(b, i, h);
                delta[c.g.lse_index(b, h, i)] = dot(&dov[at..at + d], &ov[at..at + d]);
            }
        }
    }
    // Recomputes (p, ds) of one visible pair: p the undropped probability, ds the score gradient,
    // and w the dropped-out weight that multiplied v in the forward.
    let pair = |b: usize, h: usize, i: usize, j: usize| -> (f32, f32, f32) {
        let qa = c.q_at(b, i, h);
        let ka = c.k_at(b, j, h / group);
        let lse = lsev[c.g.lse_index(b, h, i)];
        let p = (c.scale * dot(&c.q[qa..qa + d], &c.k[ka..ka + d]) - lse).exp();
        let keep = c.keep(b, h, i, j);
        let dp = dot(&dov[qa..qa + d], &c.v[ka..ka + d]) * keep;
        (p, p * (dp - delta[c.g.lse_index(b, h, i)]), p * keep)
    };
    // dK and dV: one task per (sequence, kv head, key tile).
    let mut ktasks = Vec::new();
    for b in 0..c.g.batch {
        for hk in 0..c.g.hk {
            for j0 in (0..c.g.k_spans[b].len).step_by(BK) {
                ktasks.push((b, hk, j0));
            }
        }
    }
    let kblocks: Vec<Block> = ktasks
        .par_iter()
        .map(|&(b, hk, j0)| {
            let j1 = (j0 + BK).min(c.g.k_spans[b].len);
            let mut dk = vec![0.0f32; (j1 - j0) * d];
            let mut dv = vec![0.0f32; (j1 - j0) * d];
            for h in hk * group..(hk + 1) * group {
                for i in 0..c.g.q_spans[b].len {
                    let (klo, khi) = c.g.key_range(c.mask, c.window, b, i);
                    let (lo, hi) = (klo.max(j0), khi.min(j1));
                    if lo >= hi || lsev[c.g.lse_index(b, h, i)] == f32::NEG_INFINITY {
                        continue;
                    }
                    let qa = c.q_at(b, i, h);
                    for j in lo..hi {
                        let (_, ds, w) = pair(b, h, i, j);
                        let r = (j - j0) * d;
                        for t in 0..d {
                            dv[r + t] += w * dov[qa + t];
                            dk[r + t] += c.scale * ds * c.q[qa + t];
                        }
                    }
                }
            }
            (b, hk, j0, dk, dv)
        })
        .collect();
    // dQ: one task per (sequence, query head, query block).
    let mut qtasks = Vec::new();
    for b in 0..c.g.batch {
        for h in 0..c.g.hq {
            for i0 in (0..c.g.q_spans[b].len).step_by(BQ) {
                qtasks.push((b, h, i0));
            }
        }
    }
    let qblocks: Vec<(usize, usize, usize, Vec<f32>)> = qtasks
        .par_iter()
        .map(|&(b, h, i0)| {
            let i1 = (i0 + BQ).min(c.g.q_spans[b].len);
            let mut dq = vec![0.0f32; (i1 - i0) * d];
            for i in i0..i1 {
                if lsev[c.g.lse_index(b, h, i)] == f32::NEG_INFINITY {
                    continue;
                }
                let (klo, khi) = c.g.key_range(c.mask, c.window, b, i);
                let r = (i - i0) * d;
                for j in klo..khi {
                    let (_, ds, _) = pair(b, h, i, j);
                    let ka = c.k_at(b, j, h / group);
                    for t in 0..d {
                        dq[r + t] += c.scale * ds * c.k[ka + t];
                    }
                }
            }
            (b, h, i0, dq)
        })
        .collect();
    let mut dq = vec![0.0f32; c.q.len()];
    for (b, h, i0, blk) in qblocks {
        for r in 0..blk.len() / d {
            let at = c.q_at(b, i0 + r, h);
            dq[at..at + d].copy_from_slice(&blk[r * d..(r + 1) * d]);
        }
    }
    let mut dk = vec![0.0f32; c.k.len()];
    let mut dv = vec![0.0f32; c.v.len()];
    for (b, hk, j0, kb, vb) in kblocks {
        for r in 0..kb.len() / d {
            let at = c.k_at(b, j0 + r, hk);
            dk[at..at + d].copy_from_slice(&kb[r * d..(r + 1) * d]);
            dv[at..at + d].copy_from_slice(&vb[r * d..(r + 1) * d]);
        }
    }
    Ok(AttnBwdOut {
        dq: store(&dq, a.q.shape(), a.q.dtype())?,
        dk: store(&dk, a.k.shape(), a.k.dtype())?,
        dv: store(&dv, a.v.shape(), a.v.dtype())?,
    })
}
