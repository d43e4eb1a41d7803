//! Fused attention, forward and backward: layouts bshd, sbhd and thd (packed, with
//! cu_seqlens), masks, GQA/MQA, sliding windows and dropout (Philox, see [`crate::philox`]).

use super::check;
use crate::op::{Op, OpDescriptor, OutputSpec};
use crate::{DType, Error, Result, Tensor, declare_op};

/// How q, k and v are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum QkvLayout {
    /// `[batch, seq, heads, dim]`.
    #[default]
    Bshd,
    /// `[seq, batch, heads, dim]`.
    Sbhd,
    /// `[tokens, heads, dim]`: sequences packed back to back, delimited by cu_seqlens.
    Thd,
}

/// Which (query, key) pairs take part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AttnMask {
    /// Every pair.
    #[default]
    None,
    /// Top-left causal: key j > query i is masked.
    Causal,
    /// Bottom-right causal: j > i + sk − sq is masked.
    CausalBottomRight,
    /// Padding: keys and queries past each sequence's length (from cu_seqlens) are masked.
    Padding,
    /// Padding and top-left causal.
    PaddingCausal,
}

impl AttnMask {
    /// Whether keys after the (aligned) diagonal are masked.
    pub fn is_causal(self) -> bool {
        matches!(self, AttnMask::Causal | AttnMask::CausalBottomRight | AttnMask::PaddingCausal)
    }
    /// Whether the diagonal is aligned bottom-right (sk − sq).
    pub fn bottom_right(self) -> bool {
        matches!(self, AttnMask::CausalBottomRight)
    }
    /// Whether sequence lengths come from cu_seqlens.
    pub fn is_padding(self) -> bool {
        matches!(self, AttnMask::Padding | AttnMask::PaddingCausal)
    }
}

/// Sliding window: query i sees keys in [i + δ − left, i + δ + right], δ the diagonal
/// offset (0, or sk − sq for bottom-right masks). `None` = unbounded on that side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttnWindow {
    /// Keys allowed before the diagonal.
    pub left: Option<usize>,
    /// Keys allowed after the diagonal.
    pub right: Option<usize>,
}

declare_op! {
    /// `fused_attn_fwd(q, k, v, ...) -> (o, softmax_lse)`: o = softmax(scale·q·kᵀ + mask)·v per head,
    /// with dropout on the probabilities; `softmax_lse` = log Σ exp(scale·q·kᵀ) over visible keys
    /// (−inf for a query that sees none; its output row is 0).
    pub struct FusedAttnFwd = "fused_attn_fwd";
    /// Arguments of [`FusedAttnFwd`].
    pub struct AttnFwdArgs {
        /// Queries: `[b, sq, hq, d]` (bshd), `[sq, b, hq, d]` (sbhd) or `[tq, hq, d]` (thd).
        tensor q: Tensor,
        /// Keys, with hk heads (hq a multiple of hk: GQA/MQA).
        tensor k: Tensor,
        /// Values, shaped like `k`.
        tensor v: Tensor,
        /// i32 `[b + 1]` cumulative query lengths (thd, and padding masks).
        tensor cu_seqlens_q: Option<Tensor>,
        /// i32 `[b + 1]` cumulative key lengths (thd, and padding masks).
        tensor cu_seqlens_kv: Option<Tensor>,
        /// The layout.
        scalar layout: QkvLayout,
        /// The mask.
        scalar mask: AttnMask,
        /// Multiplies q·kᵀ (usually 1/√d).
        scalar scale: f32,
        /// Dropout probability on the attention weights, in [0, 1).
        scalar dropout_p: f32,
        /// Philox seed for dropout.
        scalar seed: u64,
        /// Philox offset for dropout.
        scalar offset: u64,
        /// Sliding window.
        scalar window: AttnWindow,
        /// TE's `max_seqlen_q`: a bound on the query sequence lengths (`None`: none given).
        /// With both bounds, a thd call whose cu_seqlens are on a GPU is resolved without
        /// reading them on the host (no wait for the device): see [`attn_geometry_bounded`].
        scalar max_seqlen_q: Option<usize>,
        /// TE's `max_seqlen_kv`: a bound on the key sequence lengths (as `max_seqlen_q`).
        scalar max_seqlen_kv: Option<usize>,
    }
    /// Outputs of [`FusedAttnFwd`].
    pub struct AttnFwdOut {
        /// Output, shape of `q` (dtype of `q`).
        tensor o: Tensor,
        /// f32 `[b, hq, sq]` (bshd, sbhd) or `[hq, tq]` (thd).
        tensor softmax_lse: Tensor,
    }
    validate(a) {
        a.geometry("fused_attn_fwd", true)?;
        check_scalars("fused_attn_fwd", a.scale, a.dropout_p)
    }
    validate_values(a) {
        a.geometry("fused_attn_fwd", false).map(|_| ())
    }
    outputs(a) {
        let Ok(g) = a.geometry("fused_attn_fwd", true) else {
            return Vec::new();
        };
        vec![OutputSpec::new("o", a.q.shape(), a.q.dtype()), OutputSpec::new("softmax_lse", g.lse_shape(), DType::F32)]
    }
}

declare_op! {
    /// `fused_attn_bwd(q, k, v, o, d_o, softmax_lse, ...) -> (dq, dk, dv)`; dropout replays the
    /// forward's mask from (seed, offset).
    pub struct FusedAttnBwd = "fused_attn_bwd";
    /// Arguments of [`FusedAttnBwd`].
    pub struct AttnBwdArgs {
        /// As in the forward.
        tensor q: Tensor,
        /// As in the forward.
        tensor k: Tensor,
        /// As in the forward.
        tensor v: Tensor,
        /// The forward's output.
        tensor o: Tensor,
        /// Gradient of `o`.
        tensor d_o: Tensor,
        /// The forward's `softmax_lse`.
        tensor softmax_lse: Tensor,
        /// As in the forward.
        tensor cu_seqlens_q: Option<Tensor>,
        /// As in the forward.
        tensor cu_seqlens_kv: Option<Tensor>,
        /// As in the forward.
        scalar layout: QkvLayout,
        /// As in the forward.
        scalar mask: AttnMask,
        /// As in the forward.
        scalar scale: f32,
        /// As in the forward.
        scalar dropout_p: f32,
        /// As in the forward.
        scalar seed: u64,
        /// As in the forward.
        scalar offset: u64,
        /// As in the forward.
        scalar window: AttnWindow,
        /// As in the forward.
        scalar max_seqlen_q: Option<usize>,
        /// As in the forward.
        scalar max_seqlen_kv: Option<usize>,
        /// Whether `dq` must come out the same, bit for bit, every time the call is repeated
        /// (TE's `deterministic`). An impl whose `dq` adds the key blocks' shares into one
        /// accumulator as they finish (atomics, reduce-adds: an order that changes from run to
        /// run, so the last bits of the sums do too) runs such a call through kernels that
        /// compute each `dq` row in one pass over its keys instead, or declines it. `dk` and
        /// `dv` are deterministic in every impl.
        scalar deterministic: bool,
    }
    /// Outputs of [`FusedAttnBwd`].
    pub struct AttnBwdOut {
        /// Gradient of `q`.
        tensor dq: Tensor,
        /// Gradient of `k` (summed over the query heads sharing each kv head).
        tensor dk: Tensor,
        /// Gradient of `v`.
        tensor dv: Tensor,
    }
    validate(a) {
        const OP: &str = "fused_attn_bwd";
        let g = a.geometry(OP, true)?;
        check_scalars(OP, a.scale, a.dropout_p)?;
        check::dtype_is(OP, "o", &a.o, a.q.dtype())?;
        check::shape_is(OP, "o", &a.o, a.q.shape())?;
        check::float(OP, "d_o", &a.d_o)?;
        check::shape_is(OP, "d_o", &a.d_o, a.q.shape())?;
        check::dtype_is(OP, "softmax_lse", &a.softmax_lse, DType::F32)?;
        check::shape_is(OP, "softmax_lse", &a.softmax_lse, &g.lse_shape())
    }
    validate_values(a) {
        a.geometry("fused_attn_bwd", false).map(|_| ())
    }
    outputs(a) {
        vec![
            OutputSpec::new("dq", a.q.shape(), a.q.dtype()),
            OutputSpec::new("dk", a.k.shape(), a.k.dtype()),
            OutputSpec::new("dv", a.v.shape(), a.v.dtype()),
        ]
    }
}

impl AttnFwdArgs {
    /// The backward call of this forward: the same inputs and options (dropout replays the
    /// same mask from `seed` and `offset`), with the forward's output `o`, its `softmax_lse`
    /// and the output gradient `d_o`; not [`AttnBwdArgs::deterministic`].
    pub fn backward(&self, o: Tensor, d_o: Tensor, softmax_lse: Tensor) -> AttnBwdArgs {
        AttnBwdArgs {
            q: self.q.clone(),
            k: self.k.clone(),
            v: self.v.clone(),
            o,
            d_o,
            softmax_lse,
            cu_seqlens_q: self.cu_seqlens_q.clone(),
            cu_seqlens_kv: self.cu_seqlens_kv.clone(),
            layout: self.layout,
            mask: self.mask,
            scale: self.scale,
            dropout_p: self.dropout_p,
            seed: self.seed,
            offset: self.offset,
            window: self.window,
            max_seqlen_q: self.max_seqlen_q,
            max_seqlen_kv: self.max_seqlen_kv,
            deterministic: false,
        }
    }
}

/// What both directions of an attention call share, borrowed from their arguments
/// ([`AttnFwdArgs::qkv`], [`AttnBwdArgs::qkv`]): the inputs, sequences, options and bounds a
/// backend sets its kernels up from, so that one set-up serves the forward and the backward.
#[derive(Debug, Clone, Copy)]
pub struct AttnQkv<'a> {
    /// Queries.
    pub q: &'a Tensor,
    /// Keys.
    pub k: &'a Tensor,
    /// Values.
    pub v: &'a Tensor,
    /// The cumulative query lengths (thd, padding masks).
    pub cu_q: Option<&'a Tensor>,
    /// The cumulative key lengths (thd, padding masks).
    pub cu_k: Option<&'a Tensor>,
    /// The layout.
    pub layout: QkvLayout,
    /// The mask.
    pub mask: AttnMask,
    /// The sliding window.
    pub window: AttnWindow,
    /// The softmax scale.
    pub scale: f32,
    /// The dropout probability.
    pub dropout_p: f32,
    /// Philox seed for dropout.
    pub seed: u64,
    /// Philox offset for dropout.
    pub offset: u64,
    /// The sequence-length bounds.
    pub max: MaxSeqlen,
}

impl AttnQkv<'_> {
    /// [`attn_geometry_bounded`] of the call, for `op` (`defer` as there).
    pub fn geometry(&self, op: &'static str, defer: bool) -> Result<AttnGeometry> {
        attn_geometry_bounded(op, self.q, self.k, self.v, self.cu_q, self.cu_k, self.layout, self.mask, self.max, defer)
    }

    /// Whether dropout is applied.
    pub fn dropout(&self) -> bool {
        self.dropout_p > 0.0
    }
}

/// What the arguments of both directions answer alike (they name the shared fields alike).
macro_rules! attn_args_common {
    ($($args:ty),*) => {$(
        impl $args {
            /// The call's sequence-length bounds.
            pub fn max_seqlen(&self) -> MaxSeqlen {
                MaxSeqlen { q: self.max_seqlen_q, kv: self.max_seqlen_kv }
            }

            /// The part of the call both directions share.
            pub fn qkv(&self) -> AttnQkv<'_> {
                AttnQkv {
                    q: &self.q,
                    k: &self.k,
                    v: &self.v,
                    cu_q: self.cu_seqlens_q.as_ref(),
                    cu_k: self.cu_seqlens_kv.as_ref(),
                    layout: self.layout,
                    mask: self.mask,
                    window: self.window,
                    scale: self.scale,
                    dropout_p: self.dropout_p,
                    seed: self.seed,
                    offset: self.offset,
                    max: self.max_seqlen(),
                }
            }

            /// [`attn_geometry_bounded`] of the call's q, k, v, cu_seqlens, layout, mask and
            /// bounds, for `op` (`defer` as there).
            pub fn geometry(&self, op: &'static str, defer: bool) -> Result<AttnGeometry> {
                self.qkv().geometry(op, defer)
            }
        }
    )*};
}
attn_args_common!(AttnFwdArgs, AttnBwdArgs);

/// TE's `max_seqlen_q` and `max_seqlen_kv`: the caller's bounds on the query and key sequence
/// lengths. Where the op's validation reads the cumulative lengths (host tensors, bshd / sbhd
/// shapes, a thd call without both bounds), and before the kernel of a plugin or other impl
/// registered at run time, a sequence longer than its bound is an error naming the bound.
/// Where both are given for a thd call whose cu_seqlens are on a GPU, validation does not read
/// them: the CUDA backend resolves the call from the bounds (see [`attn_geometry_bounded`]),
/// while the Vulkan and portable kernels' impls read the lengths and check them, though not
/// against the bounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MaxSeqlen {
    /// The bound on the query sequence lengths.
    pub q: Option<usize>,
    /// The bound on the key sequence lengths.
    pub kv: Option<usize>,
}

fn check_scalars(op: &'static str, scale: f32, p: f32) -> Result<()> {
    check::positive(op, "scale", scale)?;
    check::probability(op, "dropout_p", p)
}

/// Where each sequence's rows are: its first token row and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSpan {
    /// First row (token index in thd; batch index × s otherwise, see [`AttnGeometry::row`]).
    pub start: usize,
    /// Number of valid positions.
    pub len: usize,
}

/// The shapes of an attention call, resolved from its layout and cu_seqlens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttnGeometry {
    /// The layout.
    pub layout: QkvLayout,
    /// Batch size (number of sequences).
    pub batch: usize,
    /// Query positions per sequence slot (max for thd).
    pub sq: usize,
    /// Key positions per sequence slot (max for thd).
    pub sk: usize,
    /// Query heads.
    pub hq: usize,
    /// Key/value heads.
    pub hk: usize,
    /// Head dim of q and k.
    pub d: usize,
    /// Total query rows (thd) or batch·sq.
    pub tq: usize,
    /// Query spans per sequence (none for bshd / sbhd calls with nothing to compute).
    pub q_spans: Vec<SeqSpan>,
    /// Key spans per sequence (as `q_spans`).
    pub k_spans: Vec<SeqSpan>,
    /// The spans were not read (a thd call given both [`MaxSeqlen`] bounds whose cu_seqlens
    /// are on a GPU; [`attn_geometry_bounded`]): `q_spans` and `k_spans` are empty, `sq` and
    /// `sk` are the bounds (at most the rows given), and the kernels take the sequences from
    /// cu_seqlens on the device. [`AttnGeometry::row`], [`AttnGeometry::lse_index`] and
    /// [`AttnGeometry::key_range`] need the spans and are not for such a geometry.
    pub spans_on_device: bool,
}

impl AttnGeometry {
    /// The token row of (sequence `b`, position `pos`) for queries (`keys = false`) or keys.
    /// Multiply by heads and add the head to get the (row, head) index.
    pub fn row(&self, keys: bool, b: usize, pos: usize) -> usize {
        let s = if keys { self.sk } else { self.sq };
        match self.layout {
            QkvLayout::Bshd => b * s + pos,
            QkvLayout::Sbhd => pos * self.batch + b,
            QkvLayout::Thd => (if keys { self.k_spans[b].start } else { self.q_spans[b].start }) + pos,
        }
    }

    /// Whether the `rows` token rows of q (`keys` false) or k reach past the last thd
    /// sequence: rows that belong to no sequence, which attention kernels do not write (the
    /// backends zero them in o, dq, dk and dv and set their lse to -inf). The sequences are
    /// packed back to back from row 0, so that is when the last one ends before `rows`; where
    /// it ends at the last row, every output row is some sequence's and no fill is needed.
    /// False for bshd and sbhd (every row is a position of a sequence, padding included);
    /// true (there may be) where the spans were not read ([`AttnGeometry::spans_on_device`]).
    pub fn has_rows_past_sequences(&self, keys: bool, rows: usize) -> bool {
        if self.layout != QkvLayout::Thd {
            return false;
        }
        if self.spans_on_device {
            return rows > 0;
        }
        let spans = if keys { &self.k_spans } else { &self.q_spans };
        spans.last().map_or(rows > 0, |s| s.start + s.len < rows)
    }

    /// The shape of `softmax_lse`.
    pub fn lse_shape(&self) -> Vec<usize> {
        match self.layout {
            QkvLayout::Thd => vec![self.hq, self.tq],
            _ => vec![self.batch, self.hq, self.sq],
        }
    }

    /// The index into `softmax_lse` of (sequence `b`, query head `h`, position `pos`).
    pub fn lse_index(&self, b: usize, h: usize, pos: usize) -> usize {
        match self.layout {
            QkvLayout::Thd => h * self.tq + self.q_spans[b].start + pos,
            _ => (b * self.hq + h) * self.sq + pos,
        }
    }

    /// The window as kernels should apply it: a side at least `sq + sk` wide cannot exclude
    /// any key, so it becomes unbounded (`None`). Every remaining bound is below `sq + sk`, so
    /// `i + diagonal ± bound` fits any signed type the positions fit. Every backend applies
    /// windows through this (or [`AttnGeometry::key_range`], which calls it).
    pub fn window(&self, window: AttnWindow) -> AttnWindow {
        let limit = self.sq.saturating_add(self.sk);
        let side = |w: Option<usize>| w.filter(|&x| x < limit);
        AttnWindow { left: side(window.left), right: side(window.right) }
    }

    /// The keys query `i` of sequence `b` may see, as a half-open range (empty when none).
    pub fn key_range(&self, mask: AttnMask, window: AttnWindow, b: usize, i: usize) -> (usize, usize) {
        let window = self.window(window);
        // Positions and (normalised) window bounds are below sq + sk, far from i128's range.
        let (lq, lk) = (self.q_spans[b].len as i128, self.k_spans[b].len as i128);
        let i = i as i128;
        if i >= lq {
            return (0, 0);
        }
        let diag = if mask.bottom_right() { lk - lq } else { 0 };
        let mut lo = 0i128;
        let mut hi = lk; // exclusive
        if mask.is_causal() {
            hi = hi.min(i + diag + 1);
        }
        if let Some(l) = window.left {
            lo = lo.max(i + diag - l as i128);
        }
        if let Some(r) = window.right {
            hi = hi.min(i + diag + r as i128 + 1);
        }
        if hi <= lo { (0, 0) } else { (lo as usize, hi as usize) }
    }
}

/// Checks q, k, v and the cu_seqlens against the layout and mask, and resolves the geometry
/// (reading the cu_seqlens, on the host: a tensor on a GPU waits for its device's queue).
#[allow(clippy::too_many_arguments)]
pub fn attn_geometry(
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_q: Option<&Tensor>,
    cu_k: Option<&Tensor>,
    layout: QkvLayout,
    mask: AttnMask,
) -> Result<AttnGeometry> {
    attn_geometry_bounded(op, q, k, v, cu_q, cu_k, layout, mask, MaxSeqlen::default(), false)
}

/// [`attn_geometry`] with the caller's [`MaxSeqlen`] bounds: where the lengths are read, a
/// sequence longer than its bound is an error naming `max_seqlen_q` or `max_seqlen_kv`.
///
/// With `defer`, a thd call given both bounds whose cu_seqlens are both on a GPU is resolved
/// without reading them (TE's contract: the caller's bounds size the launch, nothing waits
/// for the device): their dtype and shape are checked, `sq` and `sk` are the bounds (at most
/// the rows of q and k), and the geometry says [`AttnGeometry::spans_on_device`]. A backend
/// that asks for this takes on what the host check would have done: its kernels must stay
/// inside q, k and v whatever the lengths hold (the CUDA backend clamps them on the device
/// first), and values it computes for lengths the check would have refused (not starting at
/// 0, decreasing, past the rows given, longer than a bound) are unspecified, never an access
/// outside the tensors.
#[allow(clippy::too_many_arguments)]
pub fn attn_geometry_bounded(
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_q: Option<&Tensor>,
    cu_k: Option<&Tensor>,
    layout: QkvLayout,
    mask: AttnMask,
    max: MaxSeqlen,
    defer: bool,
) -> Result<AttnGeometry> {
    check::float(op, "q", q)?;
    check::dtype_is(op, "k", k, q.dtype())?;
    check::dtype_is(op, "v", v, q.dtype())?;
    let rank = if layout == QkvLayout::Thd { 3 } else { 4 };
    for (name, t) in [("q", q), ("k", k), ("v", v)] {
        if t.rank() != rank || t.shape()[rank - 2..].contains(&0) {
            let expected = match layout {
                QkvLayout::Bshd => "[b, s, h, d], h and d >= 1",
                QkvLayout::Sbhd => "[s, b, h, d], h and d >= 1",
                QkvLayout::Thd => "[t, h, d], h and d >= 1",
            };
            return Err(Error::Shape { op, arg: name, got: t.shape().to_vec(), expected: expected.into() });
        }
    }
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    // No sequences or no positions: q, k and v all empty is a call with nothing to compute
    // (every output is empty); an empty q beside keys, or keys missing for queries, is refused.
    if let Some((name, t)) = [("k", k), ("v", v)].into_iter().find(|(_, t)| (t.numel() == 0) != (q.numel() == 0)) {
        let expected = if q.numel() == 0 { "empty, as q is" } else { "not empty, as q is not" };
        return Err(Error::Shape { op, arg: name, got: t.shape().to_vec(), expected: format!("{expected} ({qs:?})") });
    }
    let (hq, d) = (qs[rank - 2], qs[rank - 1]);
    let (hk, dk) = (ks[rank - 2], ks[rank - 1]);
    if dk != d {
        return Err(Error::Shape { op, arg: "k", got: ks.to_vec(), expected: format!("head dim {d} (that of q)") });
    }
    // v as k: o takes q's shape, so v's head dim is q's too (every backend reads d columns of it).
    if vs != ks {
        return Err(Error::Shape { op, arg: "v", got: vs.to_vec(), expected: format!("{ks:?} (that of k)") });
    }
    if hq % hk != 0 {
        return Err(Error::invalid(op, "k", format!("{hq} query heads are not a multiple of {hk} kv heads")));
    }
    let cu = |name: &'static str, t: Option<&Tensor>, total: usize| -> Result<Option<Vec<i32>>> {
        t.map(|t| check::cu_seqlens(op, name, t, Some(total))).transpose()
    };
    let spans = |cu: &[i32]| -> Vec<SeqSpan> {
        cu.windows(2).map(|w| SeqSpan { start: w[0] as usize, len: (w[1] - w[0]) as usize }).collect()
    };
    let on_gpu = |t: &&Tensor| !t.device().is_cpu();
    if let (true, Some(cq), Some(ck), Some(mq), Some(mk)) =
        (layout == QkvLayout::Thd && defer, cu_q.filter(on_gpu), cu_k.filter(on_gpu), max.q, max.kv)
    {
        check::cu_seqlens_shape(op, "cu_seqlens_q", cq)?;
        check::cu_seqlens_shape(op, "cu_seqlens_kv", ck)?;
        if ck.numel() != cq.numel() {
            return Err(Error::invalid(
                op,
                "cu_seqlens_kv",
                format!("{} entries, cu_seqlens_q has {}", ck.numel(), cq.numel()),
            ));
        }
        return Ok(AttnGeometry {
            layout,
            batch: cq.numel() - 1,
            sq: mq.min(qs[0]),
            sk: mk.min(ks[0]),
            hq,
            hk,
            d,
            tq: qs[0],
            q_spans: Vec::new(),
            k_spans: Vec::new(),
            spans_on_device: true,
        });
    }
    let (batch, sq, sk, q_spans, k_spans, tq) = match layout {
        QkvLayout::Thd => {
            let (cq, ck) = match (cu("cu_seqlens_q", cu_q, qs[0])?, cu("cu_seqlens_kv", cu_k, ks[0])?) {
                (Some(a), Some(b)) => (a, b),
                (None, _) => return Err(Error::invalid(op, "cu_seqlens_q", "the thd layout needs cu_seqlens_q")),
                (_, None) => return Err(Error::invalid(op, "cu_seqlens_kv", "the thd layout needs cu_seqlens_kv")),
            };
            if cq.len() != ck.len() {
                return Err(Error::invalid(
                    op,
                    "cu_seqlens_kv",
                    format!("{} entries, cu_seqlens_q has {}", ck.len(), cq.len()),
                ));
            }
            let (qsp, ksp) = (spans(&cq), spans(&ck));
            let sq = qsp.iter().map(|s| s.len).max().unwrap_or(0);
            let sk = ksp.iter().map(|s| s.len).max().unwrap_or(0);
            (qsp.len(), sq, sk, qsp, ksp, qs[0])
        }
        QkvLayout::Bshd | QkvLayout::Sbhd => {
            let (b, sq, sk) = if layout == QkvLayout::Bshd { (qs[0], qs[1], ks[1]) } else { (qs[1], qs[0], ks[0]) };
            let kb = if layout == QkvLayout::Bshd { ks[0] } else { ks[1] };
            if kb != b {
                return Err(Error::Shape {
                    op,
                    arg: "k",
                    got: ks.to_vec(),
                    expected: format!("batch {b} (that of q)"),
                });
            }
            // (No spans for a call with nothing to compute: its batch may be any size, even one
            // no memory could list, when every sequence is empty.)
            let nothing = q.numel() == 0;
            let full = |s: usize| {
                if nothing { Vec::new() } else { (0..b).map(|i| SeqSpan { start: i * s, len: s }).collect::<Vec<_>>() }
            };
            let (qsp, ksp) = if mask.is_padding() {
                let lens = |name: &'static str, t: Option<&Tensor>, s: usize| -> Result<Vec<SeqSpan>> {
                    let v = cu(name, t, b * s)?
                        .ok_or_else(|| Error::invalid(op, name, format!("the {mask:?} mask needs {name}")))?;
                    if v.len() - 1 != b {
                        return Err(Error::invalid(op, name, format!("{} entries for batch {b}", v.len())));
                    }
                    v.windows(2)
                        .enumerate()
                        .map(|(i, w)| {
                            let len = (w[1] - w[0]) as usize;
                            if len > s {
                                Err(Error::invalid(op, name, format!("sequence {i} has length {len} > {s}")))
                            } else {
                                Ok(SeqSpan { start: i * s, len })
                            }
                        })
                        .collect()
                };
                (lens("cu_seqlens_q", cu_q, sq)?, lens("cu_seqlens_kv", cu_k, sk)?)
            } else {
                for (name, t) in [("cu_seqlens_q", cu_q), ("cu_seqlens_kv", cu_k)] {
                    if t.is_some() {
                        return Err(Error::invalid(
                            op,
                            name,
                            format!("only read by thd and padding masks, not {mask:?}"),
                        ));
                    }
                }
                (full(sq), full(sk))
            };
            (b, sq, sk, qsp, ksp, b * sq)
        }
    };
    for (name, bound, spans) in [("max_seqlen_q", max.q, &q_spans), ("max_seqlen_kv", max.kv, &k_spans)] {
        if let Some(m) = bound
            && let Some((i, s)) = spans.iter().enumerate().find(|(_, s)| s.len > m)
        {
            return Err(Error::invalid(op, name, format!("{m} is less than sequence {i}'s length {}", s.len)));
        }
    }
    Ok(AttnGeometry { layout, batch, sq, sk, hq, hk, d, tq, q_spans, k_spans, spans_on_device: false })
}

pub(super) fn descriptors() -> Vec<&'static OpDescriptor> {
    vec![FusedAttnFwd::descriptor(), FusedAttnBwd::descriptor()]
}
