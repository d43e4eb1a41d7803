//! Fused attention, forward and backward: layouts, masks, GQA, windows, dropout, head dims.

use tefl_core::catalogue::*;
use tefl_core::{DType, Error};

use super::{Cmp, FLOATS, Size, Suite, cmp};
use crate::oracle;

impl Suite<'_> {
    pub(super) fn attention(&mut self) {
        let none = AttnWindow::default();
        let base = |layout, mask| AttnCase {
            layout,
            mask,
            b: 2,
            sq: 37,
            sk: 45,
            hq: 4,
            hk: 2,
            d: 64,
            cu_q: None,
            cu_k: None,
            window: none,
            p: 0.0,
            amp: 1.0,
            junk: false,
            bounds: None,
        };
        let mut cases = Vec::new();
        for layout in [QkvLayout::Bshd, QkvLayout::Sbhd] {
            for mask in [AttnMask::None, AttnMask::Causal, AttnMask::CausalBottomRight] {
                cases.push(base(layout, mask));
            }
            for mask in [AttnMask::Padding, AttnMask::PaddingCausal] {
                cases.push(AttnCase { cu_q: Some(vec![0, 30, 67]), cu_k: Some(vec![0, 45, 57]), ..base(layout, mask) });
            }
        }
        for mask in
            [AttnMask::None, AttnMask::Causal, AttnMask::CausalBottomRight, AttnMask::Padding, AttnMask::PaddingCausal]
        {
            cases.push(AttnCase {
                cu_q: Some(vec![0, 5, 17, 18, 40]),
                cu_k: Some(vec![0, 7, 19, 19, 70]),
                b: 4,
                ..base(QkvLayout::Thd, mask)
            });
        }
        cases.push(AttnCase { hq: 3, hk: 1, d: 128, ..base(QkvLayout::Bshd, AttnMask::Causal) });
        cases.push(AttnCase {
            window: AttnWindow { left: Some(5), right: Some(0) },
            ..base(QkvLayout::Bshd, AttnMask::Causal)
        });
        cases.push(AttnCase {
            window: AttnWindow { left: Some(3), right: Some(2) },
            ..base(QkvLayout::Sbhd, AttnMask::None)
        });
        // Windows wider than any sequence mean unbounded, whatever the integer (issue 12).
        cases.push(AttnCase {
            window: AttnWindow { left: Some(usize::MAX), right: None },
            ..base(QkvLayout::Bshd, AttnMask::Causal)
        });
        cases.push(AttnCase {
            window: AttnWindow { left: Some(i64::MAX as usize), right: Some(i64::MAX as usize) },
            ..base(QkvLayout::Sbhd, AttnMask::None)
        });
        cases.push(AttnCase {
            window: AttnWindow { left: Some(7), right: Some(usize::MAX - 1) },
            ..base(QkvLayout::Bshd, AttnMask::CausalBottomRight)
        });
        cases.push(AttnCase { p: 0.2, ..base(QkvLayout::Bshd, AttnMask::Causal) });
        cases.push(AttnCase {
            p: 0.1,
            cu_q: Some(vec![0, 3, 20]),
            cu_k: Some(vec![0, 8, 30]),
            ..base(QkvLayout::Thd, AttnMask::None)
        });
        let thd_dropout = cases.len() - 1;
        cases.push(AttnCase { b: 1, sq: 1, sk: 1, hq: 1, hk: 1, d: 8, ..base(QkvLayout::Bshd, AttnMask::None) });
        // Head dims off the fast paths: 256 (the largest, tiles cut to fit), 96 (not a power of
        // two) and 33 (odd: scalar loads and stores).
        cases.push(AttnCase { b: 1, sq: 70, sk: 70, hq: 2, hk: 1, d: 256, ..base(QkvLayout::Bshd, AttnMask::Causal) });
        // Head dim 256 over several 64-key tiles and blocks (Hopper's kernels take 64 keys at a
        // time there) with tails, GQA, growing row maxima, and a window cutting tiles on both
        // sides. (Sizes keep lavapipe's backward under its 65535 loop iterations.)
        cases.push(AttnCase { sq: 100, sk: 200, d: 256, amp: 6.0, ..base(QkvLayout::Sbhd, AttnMask::None) });
        cases.push(AttnCase {
            b: 1,
            sq: 129,
            sk: 200,
            hq: 2,
            hk: 2,
            d: 256,
            window: AttnWindow { left: Some(90), right: Some(10) },
            ..base(QkvLayout::Bshd, AttnMask::CausalBottomRight)
        });
        cases.push(AttnCase {
            d: 96,
            cu_q: Some(vec![0, 9, 50]),
            cu_k: Some(vec![0, 20, 41]),
            ..base(QkvLayout::Thd, AttnMask::None)
        });
        cases.push(AttnCase { d: 33, ..base(QkvLayout::Sbhd, AttnMask::CausalBottomRight) });
        // Scores spread over hundreds (q and k in ±6): a row's max keeps growing past earlier
        // keys' by far, which makes online softmaxes rescale what they have summed (lazily
        // rescaling kernels included) at many steps, not just the first.
        cases.push(AttnCase {
            b: 1,
            sq: 200,
            sk: 200,
            hq: 2,
            hk: 1,
            amp: 6.0,
            ..base(QkvLayout::Bshd, AttnMask::Causal)
        });
        cases.push(AttnCase { sq: 90, sk: 150, d: 128, amp: 6.0, ..base(QkvLayout::Sbhd, AttnMask::None) });
        // Ragged sequences over several tiles, with NaN in every row outside them (thd rows past
        // the last sequence, padding rows): tiles that run past a sequence's end must not let
        // them into the sequence's results (Hopper's kernels read whole tiles and zero those
        // rows; other kernels load only the sequence's rows).
        cases.push(AttnCase {
            cu_q: Some(vec![0, 70, 150]),
            cu_k: Some(vec![0, 90, 150]),
            hq: 2,
            hk: 1,
            d: 128,
            junk: true,
            ..base(QkvLayout::Thd, AttnMask::PaddingCausal)
        });
        let thd_junk_d128 = cases.len() - 1;
        cases.push(AttnCase {
            sq: 100,
            sk: 140,
            cu_q: Some(vec![0, 70, 170]),
            cu_k: Some(vec![0, 130, 270]),
            junk: true,
            ..base(QkvLayout::Bshd, AttnMask::Padding)
        });
        cases.push(AttnCase {
            cu_q: Some(vec![0, 30, 100]),
            cu_k: Some(vec![0, 70, 100]),
            hq: 2,
            hk: 2,
            d: 256,
            junk: true,
            ..base(QkvLayout::Thd, AttnMask::None)
        });
        let thd_junk_d256 = cases.len() - 1;
        // Several 128-row query and key tiles with tails (Hopper's wgmma kernel takes 128 of each),
        // GQA, a bottom-right diagonal with a window cutting tiles on both sides. (Sizes keep
        // lavapipe's backward under its 65535 loop iterations per invocation.)
        cases.push(AttnCase { sq: 260, sk: 333, hk: 4, d: 128, ..base(QkvLayout::Bshd, AttnMask::None) });
        cases.push(AttnCase {
            b: 1,
            sq: 129,
            sk: 300,
            hq: 4,
            hk: 2,
            d: 128,
            window: AttnWindow { left: Some(150), right: Some(20) },
            ..base(QkvLayout::Sbhd, AttnMask::CausalBottomRight)
        });
        // More query tiles x heads x sequences (144) than an H100 has SMs (132).
        cases.push(AttnCase { sq: 130, sk: 130, hq: 36, hk: 12, ..base(QkvLayout::Bshd, AttnMask::Causal) });
        // More 128-key blocks x kv heads x sequences (144) than SMs, at head dim 64, so that the
        // Hopper backward's persistent CTAs each take several, ragged ones too (thd: sequences of
        // 300, 260 and 1 tokens, junk rows after them).
        cases.push(AttnCase { b: 3, sq: 260, sk: 260, hq: 16, hk: 16, ..base(QkvLayout::Bshd, AttnMask::Causal) });
        cases.push(AttnCase {
            b: 3,
            hq: 32,
            hk: 16,
            cu_q: Some(vec![0, 300, 560, 561]),
            cu_k: Some(vec![0, 300, 560, 561]),
            junk: true,
            ..base(QkvLayout::Thd, AttnMask::PaddingCausal)
        });
        let thd_many_blocks = cases.len() - 1;
        // The thd cases above again with TE's max_seqlen bounds (at or above the longest
        // sequences): the CUDA backend leaves the lengths on the device (clamped there, rows past
        // the last sequence filled there); NaN rows past the sequences, dropout, head dims 64,
        // 128 and 256.
        for (i, bounds) in [
            (thd_junk_d128, (80, 100)),
            (thd_many_blocks, (300, 300)),
            (thd_junk_d256, (128, 200)),
            (thd_dropout, (17, 22)),
        ] {
            let bounded = AttnCase { bounds: Some(bounds), ..cases[i].clone() };
            cases.push(bounded);
        }
        // The same at head dim 256 (bshd), whose key blocks are 64 keys.
        cases.push(AttnCase {
            b: 3,
            sq: 130,
            sk: 130,
            hq: 16,
            hk: 16,
            d: 256,
            ..base(QkvLayout::Bshd, AttnMask::Causal)
        });
        let long = if self.size == Size::Full { 1024 } else { 300 };
        cases.push(AttnCase {
            b: 1,
            sq: long,
            sk: long,
            hq: 2,
            hk: 1,
            d: 64,
            ..base(QkvLayout::Bshd, AttnMask::Causal)
        });
        // Quick runs take each heavy case (see `AttnCase::heavy`) in one dtype, the heavy cases
        // taking the three in turn: they test tile and block counts, which do not depend on the
        // dtype, and in all three dtypes they were 90% of a quick run's attention time on a
        // CPU device (lavapipe: 261 of 290 s). Full runs take every case in every dtype.
        let mut heavy_seen = 0;
        let one_dtype: Vec<Option<DType>> = cases
            .iter()
            .map(|c| {
                (self.size == Size::Quick && c.heavy()).then(|| {
                    heavy_seen += 1;
                    FLOATS[(heavy_seen - 1) % FLOATS.len()]
                })
            })
            .collect();
        for dtype in FLOATS {
            for (i, c) in cases.iter().enumerate() {
                if one_dtype[i].is_some_and(|d| d != dtype) {
                    continue;
                }
                // The deterministic backward's repeat check: every case in full runs; in quick
                // ones every other case and every dropout or thd case (it costs two more calls).
                let det = self.size == Size::Full || i % 2 == 0 || c.p > 0.0 || c.layout == QkvLayout::Thd;
                self.attn_case(c, dtype, det);
            }
            self.attn_unchecked_lengths(dtype);
        }
    }

    /// thd lengths the host check refuses, given with both bounds: an impl that leaves them on
    /// the device (the CUDA backend) returns unspecified values, one that reads them refuses
    /// them by name; neither may fault or write outside its tensors, which a correct call
    /// right after them (on the same device) would show.
    fn attn_unchecked_lengths(&mut self, dtype: DType) {
        let (hq, d) = (2, 64);
        let case = "thd lengths the check refuses, with max_seqlen bounds, then a correct call".to_string();
        self.case("fused_attn_fwd", dtype, case, |s| {
            let rows = 40;
            let q = s.rand(&[rows, hq, d], dtype, -1.0, 1.0)?;
            let args = |cu: &[i32], max: usize| -> tefl_core::Result<AttnFwdArgs> {
                let cu = s.put_i32(cu)?;
                Ok(AttnFwdArgs {
                    q: q.0.clone(),
                    k: q.0.clone(),
                    v: q.0.clone(),
                    cu_seqlens_q: Some(cu.clone()),
                    cu_seqlens_kv: Some(cu),
                    layout: QkvLayout::Thd,
                    mask: AttnMask::PaddingCausal,
                    scale: 0.125,
                    dropout_p: 0.0,
                    seed: 0,
                    offset: 0,
                    window: AttnWindow::default(),
                    max_seqlen_q: Some(max),
                    max_seqlen_kv: Some(max),
                })
            };
            let refused = |e: &Error| {
                matches!(
                    e,
                    Error::InvalidArgument {
                        arg: "cu_seqlens_q" | "cu_seqlens_kv" | "max_seqlen_q" | "max_seqlen_kv",
                        ..
                    }
                )
            };
            // Decreasing, past the rows, negative, not starting at 0, longer than the bound.
            for (cu, max) in [
                (&[0, 30, 10, 40][..], 30),
                (&[0, 20, 4000][..], 40),
                (&[0, -50, 40][..], 40),
                (&[7, 20, 40][..], 40),
                (&[0, 35, 40][..], 16),
                (&[0, i32::MAX, i32::MIN][..], 40),
            ] {
                let a = args(cu, max)?;
                match s.call::<FusedAttnFwd>(&a) {
                    Ok(o) => {
                        let d_o = o.o.clone();
                        match s.call::<FusedAttnBwd>(&a.backward(o.o, d_o, o.softmax_lse)) {
                            Ok(_) => {}
                            Err(e) if refused(&e) => {}
                            Err(e) => return Err(Error::Tensor(format!("backward, lengths {cu:?}: {e}"))),
                        }
                    }
                    Err(e) if refused(&e) => {}
                    Err(e) => return Err(Error::Tensor(format!("forward, lengths {cu:?}: {e}"))),
                }
            }
            // A correct call after them: the oracle's values.
            let a = args(&[0, 25, 40], 25)?;
            let g = attn_geometry(
                "conformance",
                &q.0,
                &q.0,
                &q.0,
                a.cu_seqlens_q.as_ref(),
                a.cu_seqlens_kv.as_ref(),
                a.layout,
                a.mask,
            )?;
            let prob = oracle::AttnProblem {
                g: &g,
                q: &q.1,
                k: &q.1,
                v: &q.1,
                mask: a.mask,
                window: a.window,
                scale: 0.125,
                p: 0.0,
                seed: 0,
                offset: 0,
            };
            let o = s.call::<FusedAttnFwd>(&a)?;
            Ok(vec![cmp("o", &o.o, prob.forward().o, dtype)?])
        });
    }

    fn attn_case(&mut self, c: &AttnCase, dtype: DType, check_deterministic: bool) {
        let case = format!(
            "{:?} {:?} b{} sq{} sk{} hq{} hk{} d{} window({:?},{:?}) p={} amp={}{}{}",
            c.layout,
            c.mask,
            c.b,
            c.sq,
            c.sk,
            c.hq,
            c.hk,
            c.d,
            c.window.left,
            c.window.right,
            c.p,
            c.amp,
            if c.junk { " NaN outside the sequences" } else { "" },
            c.bounds.map_or(String::new(), |(q, k)| format!(" max_seqlen ({q}, {k})")),
        );
        let extra = if c.junk { 20 } else { 0 };
        let tq = c.cu_q.as_ref().and_then(|v| v.last()).map_or(c.b * c.sq, |t| *t as usize + extra);
        let tk = c.cu_k.as_ref().and_then(|v| v.last()).map_or(c.b * c.sk, |t| *t as usize + extra);
        let shape = |s: usize, h: usize, total: usize| match c.layout {
            QkvLayout::Bshd => vec![c.b, s, h, c.d],
            QkvLayout::Sbhd => vec![s, c.b, h, c.d],
            QkvLayout::Thd => vec![total, h, c.d],
        };
        let (qs, ks) = (shape(c.sq, c.hq, tq), shape(c.sk, c.hk, tk));
        // NaN at every element of the rows outside the sequences.
        let junk = |keys: bool, total: usize, heads: usize| -> Vec<usize> {
            let row = heads * c.d;
            c.junk_rows(keys, total).into_iter().flat_map(|r| r * row..(r + 1) * row).collect()
        };
        let (q_junk, k_junk) = (junk(false, tq, c.hq), junk(true, tk, c.hk));
        let scale = 1.0 / (c.d as f32).sqrt();
        // Inputs drawn once and shared by the forward and backward cases.
        let inputs = (|| -> tefl_core::Result<_> {
            let q = self.rand_with(&qs, dtype, -c.amp, c.amp, &q_junk, f64::NAN)?;
            let k = self.rand_with(&ks, dtype, -c.amp, c.amp, &k_junk, f64::NAN)?;
            let v = self.rand_with(&ks, dtype, -1.0, 1.0, &k_junk, f64::NAN)?;
            let d_o = self.rand_with(&qs, dtype, -1.0, 1.0, &q_junk, f64::NAN)?;
            let cu_q = c.cu_q.as_deref().map(|x| self.put_i32(x)).transpose()?;
            let cu_k = c.cu_k.as_deref().map(|x| self.put_i32(x)).transpose()?;
            Ok((q, k, v, d_o, cu_q, cu_k))
        })();
        let ((q, qv), (k, kv), (v, vv), (d_o, dov), cu_q, cu_k) = match inputs {
            Ok(x) => x,
            Err(e) => {
                self.case("fused_attn_fwd", dtype, case, |_| Err(e));
                return;
            }
        };
        let fwd_args = AttnFwdArgs {
            q: q.clone(),
            k: k.clone(),
            v: v.clone(),
            cu_seqlens_q: cu_q.clone(),
            cu_seqlens_kv: cu_k.clone(),
            layout: c.layout,
            mask: c.mask,
            scale,
            dropout_p: c.p,
            seed: 1234,
            offset: 99,
            window: c.window,
            max_seqlen_q: c.bounds.map(|b| b.0),
            max_seqlen_kv: c.bounds.map(|b| b.1),
        };
        let g = match attn_geometry("conformance", &q, &k, &v, cu_q.as_ref(), cu_k.as_ref(), c.layout, c.mask) {
            Ok(g) => g,
            Err(e) => {
                self.case("fused_attn_fwd", dtype, case, |_| Err(e));
                return;
            }
        };
        let prob = oracle::AttnProblem {
            g: &g,
            q: &qv,
            k: &kv,
            v: &vv,
            mask: c.mask,
            window: c.window,
            scale: f64::from(scale),
            p: f64::from(c.p),
            seed: 1234,
            offset: 99,
        };
        self.case("fused_attn_fwd", dtype, case.clone(), |s| {
            let o = s.call::<FusedAttnFwd>(&fwd_args)?;
            let want = prob.forward();
            let got_lse = o.softmax_lse.to_vec::<f64>()?;
            if got_lse.iter().zip(&want.lse).any(|(a, b)| a.is_finite() != b.is_finite()) {
                return Err(Error::Tensor("softmax_lse: -inf rows differ from the oracle's".into()));
            }
            let (lf, wf): (Vec<f64>, Vec<f64>) =
                got_lse.iter().zip(&want.lse).filter(|(a, _)| a.is_finite()).map(|(a, b)| (*a, *b)).unzip();
            Ok(vec![
                cmp("o", &o.o, want.o, dtype)?,
                Cmp {
                    floor: (lf.len() as f64).sqrt(),
                    name: "softmax_lse",
                    got: lf,
                    want: wf,
                    dtype: DType::F32,
                    nan: false,
                },
            ])
        });
        self.case("fused_attn_bwd", dtype, case, |s| {
            let p = &prob;
            let mut fw = p.forward();
            for &i in &q_junk {
                fw.o[i] = f64::NAN;
            }
            let o = s.put(&fw.o, &qs, dtype)?;
            let lse = s.put(&fw.lse, &g.lse_shape(), DType::F32)?;
            let args = fwd_args.backward(o, d_o.clone(), lse);
            let got = s.call::<FusedAttnBwd>(&args)?;
            let (dq, dk, dv) = p.backward(&dov);
            let mut cmps = vec![
                cmp("dq", &got.dq, dq.clone(), dtype)?,
                cmp("dk", &got.dk, dk.clone(), dtype)?,
                cmp("dv", &got.dv, dv.clone(), dtype)?,
            ];
            if check_deterministic {
                // A deterministic call, twice: the same bits both times, and the oracle's
                // values. Impls whose dQ sums blocks in a varying order take it another way.
                let det_args = AttnBwdArgs { deterministic: true, ..args.clone() };
                let det = s.call::<FusedAttnBwd>(&det_args)?;
                let again = s.call::<FusedAttnBwd>(&det_args)?;
                for (name, a, b) in [("dq", &det.dq, &again.dq), ("dk", &det.dk, &again.dk), ("dv", &det.dv, &again.dv)]
                {
                    let (a, b) = (a.to_vec::<f64>()?, b.to_vec::<f64>()?);
                    if let Some(i) = a.iter().zip(&b).position(|(x, y)| x.to_bits() != y.to_bits()) {
                        return Err(Error::Tensor(format!(
                            "{name} of a deterministic call differs between two runs at element {i}: {} then {}",
                            a[i], b[i]
                        )));
                    }
                }
                cmps.push(cmp("dq (deterministic)", &det.dq, dq, dtype)?);
                cmps.push(cmp("dk (deterministic)", &det.dk, dk, dtype)?);
                cmps.push(cmp("dv (deterministic)", &det.dv, dv, dtype)?);
            }
            Ok(cmps)
        });
    }
}

/// One attention case.
#[derive(Clone)]
struct AttnCase {
    layout: QkvLayout,
    mask: AttnMask,
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hk: usize,
    d: usize,
    cu_q: Option<Vec<i32>>,
    cu_k: Option<Vec<i32>>,
    window: AttnWindow,
    p: f32,
    /// q and k are drawn from [-amp, amp] (v and dO from [-1, 1]).
    amp: f64,
    /// NaN in every row of q, k, v, dO and o outside the sequences (thd: 20 more rows past the
    /// last one; padding masks: the padding rows).
    junk: bool,
    /// TE's (max_seqlen_q, max_seqlen_kv), at or above the longest sequences.
    bounds: Option<(usize, usize)>,
}

impl AttnCase {
    /// Whether the case is one of the large ones (score elements times head dim, summed over
    /// the sequences and query heads, of 50 million or more): the cases with more tiles or key
    /// blocks than an H100 has SMs, and the long and wide ones.
    fn heavy(&self) -> bool {
        let lengths = |cu: &Option<Vec<i32>>, s: usize| -> Vec<usize> {
            cu.as_ref().map_or(vec![s; self.b], |cu| cu.windows(2).map(|w| (w[1] - w[0]).max(0) as usize).collect())
        };
        let (q, k) = (lengths(&self.cu_q, self.sq), lengths(&self.cu_k, self.sk));
        let scores: usize = q.iter().zip(&k).map(|(q, k)| q * k).sum();
        scores * self.hq * self.d >= 50_000_000
    }

    /// The rows of a tensor of `total` rows (q's when `keys` is false) outside every sequence.
    fn junk_rows(&self, keys: bool, total: usize) -> Vec<usize> {
        let (cu, s) = if keys { (&self.cu_k, self.sk) } else { (&self.cu_q, self.sq) };
        let Some(cu) = cu.as_ref().filter(|_| self.junk) else { return Vec::new() };
        let len = |b: usize| (cu[b + 1] - cu[b]) as usize;
        match self.layout {
            QkvLayout::Thd => (cu[self.b] as usize..total).collect(),
            QkvLayout::Bshd => (0..self.b).flat_map(|b| (len(b)..s).map(move |p| b * s + p)).collect(),
            QkvLayout::Sbhd => (0..self.b).flat_map(|b| (len(b)..s).map(move |p| p * self.b + b)).collect(),
        }
    }
}
