//! Flash-style attention on the CPU: queries in blocks, keys in tiles, online softmax. No
//! sq×sk buffer is ever allocated; the backward recomputes the probabilities from
//! `softmax_lse` tile by tile.
//!
//! Two paths compute the same formulas. Where q, k, v (and, backward, dO) are all finite, a
//! tile's products (S = scale·Q·Kᵀ, O += P·V; backward also dO·Vᵀ, dV += Wᵀ·dO, dK += dSᵀ·Q,
//! dQ += dS·K) run on the reference's f32 GEMM kernel, with masked pairs given probability 0.
//! A 0 times a non-finite value is NaN, though, so where an input holds a NaN or an infinity
//! the pair-by-pair path runs instead: it never touches a masked pair, so a NaN reaches exactly
//! the outputs of the pairs that see it (the conformance suite's `nan` family).

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::device::try_zeroed;
use tefl_core::philox::uniform;
use tefl_core::{DType, KernelCtx, Result, Tensor};

use crate::kernels::sgemm::{MatRef, Operand, Packed, sgemm_serial as sgemm, sgemm_serial_with};
use crate::kernels::vmath;
use crate::util::{build_f32, store, view, zeroed_f32};

/// Query rows and key rows of a block and tile on the pair-by-pair path.
const BQ: usize = 32;
const BK: usize = 64;
/// Query rows and key rows of a block and tile on the GEMM path (larger tiles amortise the
/// GEMM kernel's packing). `bench --backend reference --shapes small --only "attn_fwd
/// causal,attn_bwd causal"` (b1 h8 s1024 d128 bf16, 2 cores, ms forward / backward): 128 × 128
/// 50.7 / 187.3, 128 × 64 52.4 / 190.2, 64 × 128 60.2 / 226.3, 64 × 256 60.4 / 210.1, 32 × 128
/// 84.8 / 267.1; the pair-by-pair path 544 / 3751.
const TQ: usize = 128;
const TK: usize = 128;
/// Key tiles a backward task packs at once (their K and V), each query block's Q and dO then
/// packed once for all of them.
const WINDOW: usize = 8;
/// The most memory the backward's dQ shares take (a task's share of dQ, summed afterwards,
/// where a sequence's key tiles are split between tasks).
const DQ_SHARES_BYTES: usize = 256 << 20;

/// A GEMM-path backward task's results: dK and dV of its key tiles (`TK` rows × d each, in
/// `tiles` order) and its share of dQ for the kv head's query heads (group × query rows × d).
struct BwdPart {
    b: usize,
    hk: usize,
    tiles: Vec<usize>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    dq: Vec<f32>,
}

/// (sequence, head, first row, values, second values) computed by one task.
type Block = (usize, usize, usize, Vec<f32>, Vec<f32>);
/// A [`Block`]'s (sequence, head, first row, values, second values), borrowed for the copy into
/// the outputs.
type BlockRef<'a> = (usize, usize, usize, &'a [f32], &'a [f32]);

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
    /// Elements from one position of a head of sequence `b` to the next, in q (and o, dO) or,
    /// `keys`, in k and v: the layout's row step times a row's elements.
    fn pos_stride(&self, keys: bool, b: usize) -> usize {
        let heads = if keys { self.g.hk } else { self.g.hq };
        (self.g.row(keys, b, 1) - self.g.row(keys, b, 0)) * heads * self.g.d
    }
    /// The query block of `rows` positions from `i0` of head `h` as a GEMM operand (rows × d)
    /// of `x` (q, or o / dO, laid out like q).
    fn q_block<'x>(&self, x: &'x [f32], b: usize, h: usize, i0: usize) -> MatRef<'x> {
        MatRef { data: &x[self.q_at(b, i0, h)..], rs: self.pos_stride(false, b), cs: 1 }
    }
    /// The key tile from `j0` of kv head `hk` of `x` (k or v) as a GEMM operand: kt × d, or
    /// transposed (d × kt).
    fn k_tile<'x>(&self, x: &'x [f32], b: usize, hk: usize, j0: usize, transposed: bool) -> MatRef<'x> {
        let (data, ks) = (&x[self.k_at(b, j0, hk)..], self.pos_stride(true, b));
        if transposed { MatRef { data, rs: 1, cs: ks } } else { MatRef { data, rs: ks, cs: 1 } }
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

/// One query block of the forward, pair by pair (the path for non-finite inputs): each score a
/// dot product, each visible pair's probability added into the block's accumulators.
fn fwd_block_exact(c: &Ctx<'_>, b: usize, h: usize, i0: usize) -> Block {
    let (d, group) = (c.g.d, c.g.hq / c.g.hk);
    let i1 = (i0 + BQ).min(c.g.q_spans[b].len);
    let rows = i1 - i0;
    let hk = h / group;
    let mut acc = vec![0.0f32; rows * d];
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0.0f32; rows];
    let mut s = vec![f32::NEG_INFINITY; rows * BK];
    let (ranges, lo, hi) = key_ranges(c, b, i0, i1);
    for j0 in (lo..hi).step_by(BK) {
        let j1 = (j0 + BK).min(hi);
        for (r, &(klo, khi)) in ranges.iter().enumerate() {
            let qi = &c.q[c.q_at(b, i0 + r, h)..][..d];
            let srow = &mut s[r * BK..(r + 1) * BK];
            for j in j0..j1 {
                srow[j - j0] = if j >= klo && j < khi {
                    c.scale * vmath::dot(qi, &c.k[c.k_at(b, j, hk)..][..d])
                } else {
                    f32::NEG_INFINITY
                };
            }
            let ar = &mut acc[r * d..(r + 1) * d];
            let Some(m_new) = rescale_row(&mut m[r], &mut l[r], ar, &srow[..j1 - j0]) else { continue };
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
        }
    }
    let lse = finish_rows(d, &mut acc, &m, &l);
    (b, h, i0, acc, lse)
}

/// One query block of the forward on the GEMM kernel: per key tile, S = scale·Q·Kᵀ, masked
/// scores set to -inf, the online softmax turning each row of S into the dropped-out
/// probabilities (0 where masked), then O += P·V.
fn fwd_block_tiled(c: &Ctx<'_>, b: usize, h: usize, i0: usize) -> Block {
    let (d, group) = (c.g.d, c.g.hq / c.g.hk);
    let i1 = (i0 + TQ).min(c.g.q_spans[b].len);
    let rows = i1 - i0;
    let hk = h / group;
    let mut acc = vec![0.0f32; rows * d];
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0.0f32; rows];
    let mut tile = vec![0.0f32; rows * TK];
    let (ranges, lo, hi) = key_ranges(c, b, i0, i1);
    // The block's Q, packed once for every key tile's scores.
    let q = c.q_block(c.q, b, h, i0);
    let mut qa = Packed::default();
    qa.pack_a(rows, d, q);
    for j0 in (lo..hi).step_by(TK) {
        let j1 = (j0 + TK).min(hi);
        let kt = j1 - j0;
        let p = &mut tile[..rows * kt];
        p.fill(0.0);
        sgemm_serial_with(rows, kt, d, c.scale, Operand::packed(q, &qa), c.k_tile(c.k, b, hk, j0, true).into(), p);
        let mut any = false;
        for (r, &(klo, khi)) in ranges.iter().enumerate() {
            let prow = &mut p[r * kt..(r + 1) * kt];
            let (vlo, vhi) = visible_in_tile(klo, khi, j0, kt);
            prow[..vlo].fill(f32::NEG_INFINITY);
            prow[vhi..].fill(f32::NEG_INFINITY);
            let Some(m_new) = rescale_row(&mut m[r], &mut l[r], &mut acc[r * d..(r + 1) * d], prow) else {
                prow.fill(0.0);
                continue;
            };
            // e^(s - m_new), 0 where masked (-inf).
            l[r] += vmath::exp_shifted(prow, m_new);
            if c.p != 0.0 {
                for (jj, x) in prow.iter_mut().enumerate() {
                    *x *= c.keep(b, h, i0 + r, j0 + jj);
                }
            }
            any = true;
        }
        if any {
            sgemm(rows, d, kt, 1.0, MatRef { data: p, rs: kt, cs: 1 }, c.k_tile(c.v, b, hk, j0, false), &mut acc);
        }
    }
    let lse = finish_rows(d, &mut acc, &m, &l);
    (b, h, i0, acc, lse)
}

/// The online softmax's step for one row and one key tile of `scores` (-inf where masked):
/// the row's new reference max, with its running max `m` moved there and its sum `l` and
/// accumulators `acc` rescaled to it; `None` (nothing changed) when the tile shows the row no
/// key. The maxima propagate NaN: a NaN score (NaN in q or k) must reach the output, not be
/// dropped as `f32::max` drops it (which read as a fully masked row).
fn rescale_row(m: &mut f32, l: &mut f32, acc: &mut [f32], scores: &[f32]) -> Option<f32> {
    let tile_max = vmath::max_nan(scores);
    if tile_max == f32::NEG_INFINITY {
        return None;
    }
    let m_new = vmath::nan_max(*m, tile_max);
    let corr = (*m - m_new).exp();
    *l *= corr;
    acc.iter_mut().for_each(|x| *x *= corr);
    *m = m_new;
    Some(m_new)
}

/// The columns [lo, hi) of a key tile (keys j0..j0 + kt) that a row seeing keys [klo, khi)
/// sees (lo == hi when none).
fn visible_in_tile(klo: usize, khi: usize, j0: usize, kt: usize) -> (usize, usize) {
    let lo = klo.saturating_sub(j0).min(kt);
    (lo, khi.saturating_sub(j0).min(kt).max(lo))
}

/// The keys each query row i0..i1 of sequence `b` sees, and the span [lo, hi) covering them all.
fn key_ranges(c: &Ctx<'_>, b: usize, i0: usize, i1: usize) -> (Vec<(usize, usize)>, usize, usize) {
    let ranges: Vec<(usize, usize)> = (i0..i1).map(|i| c.g.key_range(c.mask, c.window, b, i)).collect();
    let lo = ranges.iter().filter(|r| r.1 > r.0).map(|r| r.0).min().unwrap_or(0);
    let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    (ranges, lo, hi)
}

/// A forward block's end: each row of the accumulators divided by its sum l, and the rows'
/// lse (m + ln l; -inf for a row that saw no key).
fn finish_rows(d: usize, acc: &mut [f32], m: &[f32], l: &[f32]) -> Vec<f32> {
    let mut lse = vec![f32::NEG_INFINITY; l.len()];
    for r in 0..l.len() {
        if l[r] > 0.0 || l[r].is_nan() {
            let inv = 1.0 / l[r];
            acc[r * d..(r + 1) * d].iter_mut().for_each(|x| *x *= inv);
            lse[r] = m[r] + l[r].ln();
        }
    }
    lse
}

/// Whether every element of every slice is finite: the condition of the GEMM path.
fn all_finite(xs: &[&[f32]]) -> bool {
    xs.iter().all(|x| vmath::all_finite(x))
}

/// (sequence, head, first row) of every block of `step` rows of each of `heads` heads of the
/// sequences `spans`: the parallel tasks of a pass.
fn block_tasks(spans: &[SeqSpan], heads: usize, step: usize) -> Vec<(usize, usize, usize)> {
    let mut tasks = Vec::new();
    for (b, span) in spans.iter().enumerate() {
        for h in 0..heads {
            tasks.extend((0..span.len).step_by(step).map(|i0| (b, h, i0)));
        }
    }
    tasks
}

/// The catalogue op `fused_attn_fwd` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn fused_attn_fwd(_: &KernelCtx<'_>, a: &AttnFwdArgs) -> Result<AttnFwdOut> {
    let (qv, kv, vv) = (view(&a.q)?, view(&a.k)?, view(&a.v)?);
    let c = attn_ctx!(a, "fused_attn_fwd", qv, kv, vv);
    let d = c.g.d;
    let tiled = all_finite(&[c.q, c.k, c.v]);
    let tasks = block_tasks(&c.g.q_spans, c.g.hq, if tiled { TQ } else { BQ });
    let blocks: Vec<Block> = tasks
        .par_iter()
        .map(|&(b, h, i0)| if tiled { fwd_block_tiled(&c, b, h, i0) } else { fwd_block_exact(&c, b, h, i0) })
        .collect();
    let lse_len: usize = c.g.lse_shape().iter().product();
    let mut lse = try_zeroed::<f32>(lse_len, || format!("attention softmax_lse [{lse_len}]"))?;
    lse.fill(f32::NEG_INFINITY);
    let (o, ()) = build_f32(a.q.shape(), a.q.dtype(), "attention output o", |o| {
        for (b, h, i0, acc, l) in blocks {
            for (r, lv) in l.iter().enumerate() {
                let at = c.q_at(b, i0 + r, h);
                o[at..at + d].copy_from_slice(&acc[r * d..(r + 1) * d]);
                lse[c.g.lse_index(b, h, i0 + r)] = *lv;
            }
        }
        Ok(())
    })?;
    let lse_shape = c.g.lse_shape();
    Ok(AttnFwdOut { o, softmax_lse: Tensor::from_slice(&lse, lse_shape, DType::F32)? })
}

/// The catalogue op `fused_attn_bwd` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn fused_attn_bwd(_: &KernelCtx<'_>, a: &AttnBwdArgs) -> Result<AttnBwdOut> {
    let (qv, kv, vv) = (view(&a.q)?, view(&a.k)?, view(&a.v)?);
    let (ov, dov, lsev) = (view(&a.o)?, view(&a.d_o)?, view(&a.softmax_lse)?);
    let c = attn_ctx!(a, "fused_attn_bwd", qv, kv, vv);
    let (d, group) = (c.g.d, c.g.hq / c.g.hk);
    // D_i = Σ dO·O per (query row, head), indexed like lse.
    let mut delta = try_zeroed::<f32>(lsev.len(), || format!("attention delta [{}]", lsev.len()))?;
    for b in 0..c.g.batch {
        for h in 0..c.g.hq {
            for i in 0..c.g.q_spans[b].len {
                let at = c.q_at(b, i, h);
                delta[c.g.lse_index(b, h, i)] = vmath::dot(&dov[at..at + d], &ov[at..at + d]);
            }
        }
    }
    // Recomputes (p, ds) of one visible pair: p the undropped probability, ds the score gradient,
    // and w the dropped-out weight that multiplied v in the forward.
    let pair = |b: usize, h: usize, i: usize, j: usize| -> (f32, f32, f32) {
        let qa = c.q_at(b, i, h);
        let ka = c.k_at(b, j, h / group);
        let lse = lsev[c.g.lse_index(b, h, i)];
        let p = (c.scale * vmath::dot(&c.q[qa..qa + d], &c.k[ka..ka + d]) - lse).exp();
        let keep = c.keep(b, h, i, j);
        let dp = vmath::dot(&dov[qa..qa + d], &c.v[ka..ka + d]) * keep;
        (p, p * (dp - delta[c.g.lse_index(b, h, i)]), p * keep)
    };
    // The GEMM path's tile (see the module's doc): for query rows i0.. of head h, which see the
    // keys `ranges` (a row each), against keys j0.. (`kt`), given the scores S·scale in `w` and
    // dP = dO·Vᵀ in `ds` (each rows × kt), turns them into the dropped-out probabilities w
    // (what multiplied v in the forward) and the score gradients ds, 0 where a pair is masked
    // (or its row saw no key); false when no pair of the tile is visible.
    let tiled = all_finite(&[c.q, c.k, c.v, &dov]);
    let grads = |b: usize,
                 h: usize,
                 i0: usize,
                 ranges: &[(usize, usize)],
                 j0: usize,
                 kt: usize,
                 w: &mut [f32],
                 ds: &mut [f32]| {
        let mut any = false;
        for (r, &(klo, khi)) in ranges.iter().enumerate() {
            let i = i0 + r;
            let li = c.g.lse_index(b, h, i);
            let (wr, dr) = (&mut w[r * kt..(r + 1) * kt], &mut ds[r * kt..(r + 1) * kt]);
            let (vlo, vhi) = visible_in_tile(klo, khi, j0, kt);
            let lse = lsev[li];
            if lse == f32::NEG_INFINITY || vlo == vhi {
                wr.fill(0.0);
                dr.fill(0.0);
                continue;
            }
            for row in [&mut *wr, &mut *dr] {
                row[..vlo].fill(0.0);
                row[vhi..].fill(0.0);
            }
            // P = e^(s - lse) (scores are finite on this path), dS = P ∘ (dP·keep - delta), W = P·keep.
            let (pv, dpv) = (&mut wr[vlo..vhi], &mut dr[vlo..vhi]);
            vmath::exp_shifted(pv, lse);
            let delta_i = delta[li];
            if c.p == 0.0 {
                dpv.iter_mut().zip(pv.iter()).for_each(|(dp, p)| *dp = p * (*dp - delta_i));
            } else {
                for (jj, (s, dp)) in pv.iter_mut().zip(dpv.iter_mut()).enumerate() {
                    let keep = c.keep(b, h, i, j0 + vlo + jj);
                    *dp = *s * (*dp * keep - delta_i);
                    *s *= keep;
                }
            }
            any = true;
        }
        any
    };
    // The GEMM path's work: one task per (sequence, kv head, share of its key tiles). A task
    // computes, for its key tiles against every query block of the group's heads that sees
    // them, the five products of a tile pair (S = scale·Q·Kᵀ, dP = dO·Vᵀ, dV += Wᵀ·dO,
    // dK += scale·dSᵀ·Q, dQ += scale·dS·K): dK and dV of its tiles whole, and its share of
    // dQ, summed over the shares afterwards in a fixed order. Its key tiles are taken
    // WINDOW at a time, their K and V packed once for the window, and each query block's Q
    // and dO packed once for all the window's tiles.
    let bwd_task = |b: usize, hk: usize, tiles: &[usize]| -> Result<BwdPart> {
        let (lq, lk) = (c.g.q_spans[b].len, c.g.k_spans[b].len);
        let kv_len = tiles.len() * TK * d;
        let mut part = BwdPart {
            b,
            hk,
            tiles: tiles.to_vec(),
            dk: try_zeroed(kv_len, || format!("attention dk share [{kv_len}]"))?,
            dv: try_zeroed(kv_len, || format!("attention dv share [{kv_len}]"))?,
            dq: try_zeroed(group * lq * d, || format!("attention dq share [{}]", group * lq * d))?,
        };
        let (mut w, mut ds) = (vec![0.0f32; TQ * TK], vec![0.0f32; TQ * TK]);
        let [mut qa, mut qb, mut oa, mut ob] = std::array::from_fn::<Packed, 4, _>(|_| Packed::default());
        let mut kv: Vec<[Packed; 3]> = Vec::new();
        for (wi, window) in tiles.chunks(WINDOW).enumerate() {
            // Per tile of the window: Kᵀ (the scores' B), Vᵀ (dP's B) and K (dQ's B).
            kv.resize_with(window.len(), Default::default);
            for (&j0, [kt_p, vt_p, k_p]) in window.iter().zip(kv.iter_mut()) {
                let kt = (j0 + TK).min(lk) - j0;
                kt_p.pack_b(d, kt, c.k_tile(c.k, b, hk, j0, true));
                vt_p.pack_b(d, kt, c.k_tile(c.v, b, hk, j0, true));
                k_p.pack_b(kt, d, c.k_tile(c.k, b, hk, j0, false));
            }
            for gi in 0..group {
                let h = hk * group + gi;
                for i0 in (0..lq).step_by(TQ) {
                    let rows = (i0 + TQ).min(lq) - i0;
                    // The window's tiles some row of the block sees.
                    let (ranges, _, _) = key_ranges(&c, b, i0, i0 + rows);
                    let sees = |j0: usize| {
                        let j1 = (j0 + TK).min(lk);
                        ranges.iter().any(|&(klo, khi)| klo.max(j0) < khi.min(j1))
                    };
                    if !window.iter().any(|&j0| sees(j0)) {
                        continue;
                    }
                    let (q, o) = (c.q_block(c.q, b, h, i0), c.q_block(&dov, b, h, i0));
                    qa.pack_a(rows, d, q);
                    oa.pack_a(rows, d, o);
                    qb.pack_b(rows, d, q);
                    ob.pack_b(rows, d, o);
                    let dq = &mut part.dq[(gi * lq + i0) * d..][..rows * d];
                    for (t, (&j0, [kt_p, vt_p, k_p])) in window.iter().zip(kv.iter()).enumerate() {
                        if !sees(j0) {
                            continue;
                        }
                        let kt = (j0 + TK).min(lk) - j0;
                        let (w, ds) = (&mut w[..rows * kt], &mut ds[..rows * kt]);
                        w.fill(0.0);
                        ds.fill(0.0);
                        // The scores and dP (the packed Kᵀ and Vᵀ stand for the strided tiles).
                        let (ktile_t, vtile_t) = (c.k_tile(c.k, b, hk, j0, true), c.k_tile(c.v, b, hk, j0, true));
                        sgemm_serial_with(
                            rows,
                            kt,
                            d,
                            c.scale,
                            Operand::packed(q, &qa),
                            Operand::packed(ktile_t, kt_p),
                            w,
                        );
                        sgemm_serial_with(
                            rows,
                            kt,
                            d,
                            1.0,
                            Operand::packed(o, &oa),
                            Operand::packed(vtile_t, vt_p),
                            ds,
                        );
                        if !grads(b, h, i0, &ranges, j0, kt, w, ds) {
                            continue;
                        }
                        let at = (wi * WINDOW + t) * TK * d;
                        let (dk, dv) = (&mut part.dk[at..][..kt * d], &mut part.dv[at..][..kt * d]);
                        let wt = MatRef { data: w, rs: 1, cs: kt };
                        let dst = MatRef { data: ds, rs: 1, cs: kt };
                        sgemm_serial_with(kt, d, rows, 1.0, wt.into(), Operand::packed(o, &ob), dv);
                        sgemm_serial_with(kt, d, rows, c.scale, dst.into(), Operand::packed(q, &qb), dk);
                        let (dsm, ktile) = (MatRef { data: ds, rs: kt, cs: 1 }, c.k_tile(c.k, b, hk, j0, false));
                        sgemm_serial_with(rows, d, kt, c.scale, dsm.into(), Operand::packed(ktile, k_p), dq);
                    }
                }
            }
        }
        Ok(part)
    };
    let (parts, exact_k, exact_q) = if tiled {
        // Each (sequence, kv head) split into `shares` tasks taking every shares-th key tile
        // (so that causal masks' unequal tiles even out), enough tasks for the pool when there
        // are few heads, within DQ_SHARES_BYTES of dQ shares.
        let units = c.g.batch * c.g.hk;
        let most_tiles = c.g.k_spans.iter().map(|s| s.len.div_ceil(TK)).max().unwrap_or(1).max(1);
        let dq_bytes = c.g.hq * c.g.q_spans.iter().map(|s| s.len).sum::<usize>() * d * 4;
        let shares = (2 * rayon::current_num_threads())
            .div_ceil(units.max(1))
            .min(most_tiles)
            .min((DQ_SHARES_BYTES / dq_bytes.max(1)).max(1))
            .max(1);
        let mut tasks = Vec::new();
        for b in 0..c.g.batch {
            let tiles: Vec<usize> = (0..c.g.k_spans[b].len).step_by(TK).collect();
            for hk in 0..c.g.hk {
                for share in 0..shares {
                    let mine: Vec<usize> = tiles.iter().copied().skip(share).step_by(shares).collect();
                    if !mine.is_empty() || share == 0 {
                        tasks.push((b, hk, mine));
                    }
                }
            }
        }
        let mut parts: Vec<BwdPart> =
            tasks.par_iter().map(|(b, hk, tiles)| bwd_task(*b, *hk, tiles)).collect::<Result<_>>()?;
        // The shares of one (sequence, kv head) are adjacent in `parts`, in share order: their
        // dQ summed into the first share in that order, the same bits every run.
        for shares in parts.chunk_by_mut(|x, y| (x.b, x.hk) == (y.b, y.hk)) {
            let (first, rest) = shares.split_at_mut(1);
            for p in rest {
                first[0].dq.iter_mut().zip(&p.dq).for_each(|(s, x)| *s += x);
            }
        }
        (parts, Vec::new(), Vec::new())
    } else {
        // dK and dV: one task per (sequence, kv head, key tile).
        let kblocks: Vec<Block> = block_tasks(&c.g.k_spans, c.g.hk, BK)
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
        let qblocks: Vec<(usize, usize, usize, Vec<f32>)> = block_tasks(&c.g.q_spans, c.g.hq, BQ)
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
        (Vec::new(), kblocks, qblocks)
    };
    // Every result as (sequence, kv head, first key, dK rows, dV rows) and (sequence, query
    // head, first query, dQ rows), slices of the tasks' own buffers: the tiled path's key tiles,
    // and each (sequence, kv head)'s first share, which holds the summed dQ of its query heads.
    let mut kblocks: Vec<BlockRef<'_>> =
        exact_k.iter().map(|(b, hk, j0, dk, dv)| (*b, *hk, *j0, &dk[..], &dv[..])).collect();
    let mut qblocks: Vec<(usize, usize, usize, &[f32])> =
        exact_q.iter().map(|(b, h, i0, dq)| (*b, *h, *i0, &dq[..])).collect();
    for shares in parts.chunk_by(|x, y| (x.b, x.hk) == (y.b, y.hk)) {
        let first = &shares[0];
        let lq = c.g.q_spans[first.b].len;
        qblocks.extend((0..group).map(|gi| (first.b, first.hk * group + gi, 0, &first.dq[gi * lq * d..][..lq * d])));
        for p in shares {
            for (t, &j0) in p.tiles.iter().enumerate() {
                let (at, kt) = (t * TK * d, (j0 + TK).min(c.g.k_spans[p.b].len) - j0);
                kblocks.push((p.b, p.hk, j0, &p.dk[at..][..kt * d], &p.dv[at..][..kt * d]));
            }
        }
    }
    let (dq, ()) = build_f32(a.q.shape(), a.q.dtype(), "attention output dq", |dq| {
        for (b, h, i0, blk) in qblocks {
            for r in 0..blk.len() / d {
                let at = c.q_at(b, i0 + r, h);
                dq[at..at + d].copy_from_slice(&blk[r * d..(r + 1) * d]);
            }
        }
        Ok(())
    })?;
    let (dk, dv) =
        (zeroed_f32(a.k.shape(), || "attention dk".into())?, zeroed_f32(a.v.shape(), || "attention dv".into())?);
    {
        let (mut kw, mut vw) = (dk.host_bytes_mut()?, dv.host_bytes_mut()?);
        let (dkv, dvv): (&mut [f32], &mut [f32]) =
            (bytemuck::cast_slice_mut(&mut kw), bytemuck::cast_slice_mut(&mut vw));
        for &(b, hk, j0, kb, vb) in &kblocks {
            for r in 0..kb.len() / d {
                let at = c.k_at(b, j0 + r, hk);
                dkv[at..at + d].copy_from_slice(&kb[r * d..(r + 1) * d]);
                dvv[at..at + d].copy_from_slice(&vb[r * d..(r + 1) * d]);
            }
        }
    }
    let narrow = |t: Tensor, like: &Tensor| -> Result<Tensor> {
        if like.dtype() == DType::F32 { Ok(t) } else { store(&view(&t)?, like.shape(), like.dtype()) }
    };
    Ok(AttnBwdOut { dq, dk: narrow(dk, &a.k)?, dv: narrow(dv, &a.v)? })
}
