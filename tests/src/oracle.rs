//! The f64 oracle: plain, unoptimised formulas from OPS.md, written independently of every
//! backend (no tiling, no online softmax, no shared helpers with `tefl-backend-reference`).
//! Inputs are the exact values the tensors hold (half types widened exactly).

use tefl_core::catalogue::{Activation, AdamMode, AmaxAlgo, AttnGeometry, AttnMask, AttnWindow, GemmEpilogue};
use tefl_core::fp8::Fp8Format;

/// RMSNorm forward over rows of width n: (y, rsigma).
pub fn rmsnorm_fwd(x: &[f64], n: usize, gamma: &[f64], eps: f64, zc: bool) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; x.len()];
    let mut rs = Vec::new();
    for (r, row) in x.chunks(n).enumerate() {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
        let rsig = 1.0 / (ms + eps).sqrt();
        rs.push(rsig);
        for i in 0..n {
            let g = if zc { 1.0 + gamma[i] } else { gamma[i] };
            y[r * n + i] = row[i] * rsig * g;
        }
    }
    (y, rs)
}

/// RMSNorm backward: (dx, dgamma).
pub fn rmsnorm_bwd(dy: &[f64], x: &[f64], rs: &[f64], n: usize, gamma: &[f64], zc: bool) -> (Vec<f64>, Vec<f64>) {
    let mut dx = vec![0.0; x.len()];
    let mut dg = vec![0.0; n];
    for r in 0..x.len() / n {
        let xh: Vec<f64> = (0..n).map(|i| x[r * n + i] * rs[r]).collect();
        let d: Vec<f64> = (0..n).map(|i| dy[r * n + i] * if zc { 1.0 + gamma[i] } else { gamma[i] }).collect();
        let mean = (0..n).map(|i| d[i] * xh[i]).sum::<f64>() / n as f64;
        for i in 0..n {
            dx[r * n + i] = rs[r] * (d[i] - xh[i] * mean);
            dg[i] += dy[r * n + i] * xh[i];
        }
    }
    (dx, dg)
}

/// LayerNorm forward: (y, mu, rsigma).
pub fn layernorm_fwd(
    x: &[f64],
    n: usize,
    gamma: &[f64],
    beta: &[f64],
    eps: f64,
    zc: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; x.len()];
    let (mut mu, mut rs) = (Vec::new(), Vec::new());
    for (r, row) in x.chunks(n).enumerate() {
        let m = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - m).powi(2)).sum::<f64>() / n as f64;
        let rsig = 1.0 / (var + eps).sqrt();
        mu.push(m);
        rs.push(rsig);
        for i in 0..n {
            let g = if zc { 1.0 + gamma[i] } else { gamma[i] };
            y[r * n + i] = (row[i] - m) * rsig * g + beta[i];
        }
    }
    (y, mu, rs)
}

/// LayerNorm backward: (dx, dgamma, dbeta).
#[allow(clippy::too_many_arguments)]
pub fn layernorm_bwd(
    dy: &[f64],
    x: &[f64],
    mu: &[f64],
    rs: &[f64],
    n: usize,
    gamma: &[f64],
    zc: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut dx = vec![0.0; x.len()];
    let (mut dg, mut db) = (vec![0.0; n], vec![0.0; n]);
    for r in 0..x.len() / n {
        let xh: Vec<f64> = (0..n).map(|i| (x[r * n + i] - mu[r]) * rs[r]).collect();
        let d: Vec<f64> = (0..n).map(|i| dy[r * n + i] * if zc { 1.0 + gamma[i] } else { gamma[i] }).collect();
        let md = d.iter().sum::<f64>() / n as f64;
        let mdx = (0..n).map(|i| d[i] * xh[i]).sum::<f64>() / n as f64;
        for i in 0..n {
            dx[r * n + i] = rs[r] * (d[i] - md - xh[i] * mdx);
            dg[i] += dy[r * n + i] * xh[i];
            db[i] += dy[r * n + i];
        }
    }
    (dx, dg, db)
}

/// max(x, 0) that keeps NaN (NaN in, NaN out).
fn relu(x: f64) -> f64 {
    if x.is_nan() { x } else { x.max(0.0) }
}

/// min(x, limit) that keeps NaN.
fn min_keep_nan(x: f64, limit: f64) -> f64 {
    if x.is_nan() { x } else { x.min(limit) }
}

/// tanh-GELU and friends in f64.
pub fn act(kind: Activation, x: f64) -> f64 {
    let sig = |z: f64| 1.0 / (1.0 + (-z).exp());
    match kind {
        Activation::Gelu => 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh()),
        Activation::Qgelu => x * sig(1.702 * x),
        Activation::Relu => relu(x),
        Activation::Srelu => relu(x).powi(2),
        Activation::Silu => x * sig(x),
    }
}

/// The derivative of [`act`], by the closed forms.
pub fn dact(kind: Activation, x: f64) -> f64 {
    let sig = |z: f64| 1.0 / (1.0 + (-z).exp());
    match kind {
        Activation::Gelu => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let t = (k * (x + 0.044715 * x.powi(3))).tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x)
        }
        Activation::Qgelu => sig(1.702 * x) + 1.702 * x * sig(1.702 * x) * (1.0 - sig(1.702 * x)),
        Activation::Relu if x.is_nan() => x,
        Activation::Relu => f64::from(u8::from(x > 0.0)),
        Activation::Srelu => 2.0 * relu(x),
        Activation::Silu => sig(x) * (1.0 + x * (1.0 - sig(x))),
    }
}

/// Gated forward on rows of width 2n.
pub fn gated(kind: Activation, x: &[f64], n: usize) -> Vec<f64> {
    x.chunks(2 * n).flat_map(|r| (0..n).map(move |j| act(kind, r[j]) * r[n + j])).collect()
}

/// Clamped SwiGLU forward.
pub fn clamped_swiglu(x: &[f64], n: usize, limit: f64, alpha: f64) -> Vec<f64> {
    x.chunks(2 * n)
        .flat_map(|r| {
            (0..n).map(move |j| {
                let a = min_keep_nan(r[j], limit);
                let b = r[n + j].clamp(-limit, limit);
                a / (1.0 + (-alpha * a).exp()) * (b + 1.0)
            })
        })
        .collect()
}

/// Clamped SwiGLU backward: the gradient of [`clamped_swiglu`] for rows of width 2n, given
/// the output gradient `grad` (rows of width n). NaN in an input gives NaN where it is read.
pub fn clamped_dswiglu(x: &[f64], grad: &[f64], n: usize, limit: f64, alpha: f64) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for (r, (xr, gr)) in x.chunks(2 * n).zip(grad.chunks(n)).enumerate() {
        for j in 0..n {
            let (ar, br, g) = (xr[j], xr[n + j], gr[j]);
            let a = min_keep_nan(ar, limit);
            let sg = 1.0 / (1.0 + (-alpha * a).exp());
            let da = if ar.is_nan() {
                ar
            } else if ar < limit {
                sg + alpha * a * sg * (1.0 - sg)
            } else {
                0.0
            };
            let db = if br.is_nan() {
                br
            } else if (-limit..=limit).contains(&br) {
                1.0
            } else {
                0.0
            };
            out[r * 2 * n + j] = g * (br.clamp(-limit, limit) + 1.0) * da;
            out[r * 2 * n + n + j] = g * a * sg * db;
        }
    }
    out
}

/// The softmax family: rows of width sk over `[.., sq, sk]`; `masked(row, i, j)`.
pub fn softmax(x: &[f64], sq: usize, sk: usize, scale: f64, masked: impl Fn(usize, usize, usize) -> bool) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (r, row) in x.chunks(sk).enumerate() {
        let i = r % sq;
        let vis: Vec<usize> = (0..sk).filter(|&j| !masked(r, i, j)).collect();
        if vis.is_empty() {
            continue;
        }
        let m = vis.iter().map(|&j| row[j] * scale).fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = vis.iter().map(|&j| (row[j] * scale - m).exp()).sum();
        for &j in &vis {
            y[r * sk + j] = (row[j] * scale - m).exp() / s;
        }
    }
    y
}

/// op(A)·op(B) with the epilogue: (d, aux_out, bias_grad).
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub fn gemm(
    a: &[f64],
    b: &[f64],
    (m, k, n): (usize, usize, usize),
    transa: bool,
    transb: bool,
    alpha: f64,
    c: Option<&[f64]>,
    bias: Option<&[f64]>,
    aux: Option<&[f64]>,
    ep: GemmEpilogue,
) -> (Vec<f64>, Option<Vec<f64>>, Option<Vec<f64>>) {
    let at = |i: usize, l: usize| if transa { a[l * m + i] } else { a[i * k + l] };
    let bt = |l: usize, j: usize| if transb { b[j * k + l] } else { b[l * n + j] };
    let mut d = vec![0.0; m * n];
    let mut aux_out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut p = alpha * (0..k).map(|l| at(i, l) * bt(l, j)).sum::<f64>();
            if let Some(c) = c {
                p += c[i * n + j];
            }
            d[i * n + j] = match ep {
                GemmEpilogue::None | GemmEpilogue::BiasGrad => p,
                GemmEpilogue::Bias => p + bias.map_or(0.0, |b| b[j]),
                GemmEpilogue::Gelu | GemmEpilogue::BiasGelu => {
                    let pre = p + bias.map_or(0.0, |b| b[j]);
                    aux_out[i * n + j] = pre;
                    act(Activation::Gelu, pre)
                }
                GemmEpilogue::DGelu | GemmEpilogue::DGeluBiasGrad => {
                    p * dact(Activation::Gelu, aux.map_or(0.0, |x| x[i * n + j]))
                }
            };
        }
    }
    let bias_grad = matches!(ep, GemmEpilogue::BiasGrad | GemmEpilogue::DGeluBiasGrad)
        .then(|| (0..n).map(|j| (0..m).map(|i| d[i * n + j]).sum()).collect());
    let aux_out = matches!(ep, GemmEpilogue::Gelu | GemmEpilogue::BiasGelu).then_some(aux_out);
    (d, aux_out, bias_grad)
}

/// The dropout keep factor of attention probability (b, h, i, j): 0 or 1/(1 − p).
#[allow(clippy::too_many_arguments)]
pub fn attn_keep(g: &AttnGeometry, p: f64, seed: u64, offset: u64, b: usize, h: usize, i: usize, j: usize) -> f64 {
    if p == 0.0 {
        return 1.0;
    }
    let idx = (((b * g.hq + h) * g.sq + i) * g.sk + j) as u64;
    if f64::from(tefl_core::philox::uniform(seed, offset, idx)) >= p { 1.0 / (1.0 - p) } else { 0.0 }
}

/// Which keys query i of sequence b sees, written out from the mask definitions.
pub fn visible(g: &AttnGeometry, mask: AttnMask, w: AttnWindow, b: usize, i: usize, j: usize) -> bool {
    // i128: every usize window bound (up to usize::MAX) is exact, so a huge window is simply
    // unbounded, by arithmetic rather than by a special case.
    let (lq, lk) = (g.q_spans[b].len as i128, g.k_spans[b].len as i128);
    let (i, j) = (i as i128, j as i128);
    if i >= lq || j >= lk {
        return false;
    }
    let diag = if mask == AttnMask::CausalBottomRight { lk - lq } else { 0 };
    let causal = matches!(mask, AttnMask::Causal | AttnMask::CausalBottomRight | AttnMask::PaddingCausal);
    if causal && j > i + diag {
        return false;
    }
    if let Some(l) = w.left
        && j < i + diag - l as i128
    {
        return false;
    }
    if let Some(r) = w.right
        && j > i + diag + r as i128
    {
        return false;
    }
    true
}

/// Naive attention: materialises every score. Returns (o, lse, and for the backward the
/// per-(b, h, i) probability rows).
pub struct AttnRef {
    /// Output, laid out like q.
    pub o: Vec<f64>,
    /// Log-sum-exp, laid out like the op's softmax_lse.
    pub lse: Vec<f64>,
}

/// Everything the naive attention needs.
pub struct AttnProblem<'a> {
    /// Geometry (from the op's own validation).
    pub g: &'a AttnGeometry,
    /// q values.
    pub q: &'a [f64],
    /// k values.
    pub k: &'a [f64],
    /// v values.
    pub v: &'a [f64],
    /// Mask.
    pub mask: AttnMask,
    /// Window.
    pub window: AttnWindow,
    /// Scale.
    pub scale: f64,
    /// Dropout.
    pub p: f64,
    /// Seed.
    pub seed: u64,
    /// Offset.
    pub offset: u64,
}

impl AttnProblem<'_> {
    fn qa(&self, b: usize, i: usize, h: usize) -> usize {
        (self.g.row(false, b, i) * self.g.hq + h) * self.g.d
    }
    fn ka(&self, b: usize, j: usize, h: usize) -> usize {
        (self.g.row(true, b, j) * self.g.hk + h / (self.g.hq / self.g.hk)) * self.g.d
    }
    fn probs(&self, b: usize, h: usize, i: usize) -> (Vec<f64>, f64) {
        let d = self.g.d;
        let lk = self.g.k_spans[b].len;
        let qa = self.qa(b, i, h);
        let s: Vec<Option<f64>> = (0..lk)
            .map(|j| {
                visible(self.g, self.mask, self.window, b, i, j).then(|| {
                    let ka = self.ka(b, j, h);
                    self.scale * (0..d).map(|t| self.q[qa + t] * self.k[ka + t]).sum::<f64>()
                })
            })
            .collect();
        // A NaN score (NaN in q or k) makes the row NaN: it must not be dropped by the max.
        let m = s
            .iter()
            .flatten()
            .fold(f64::NEG_INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) });
        if m == f64::NEG_INFINITY {
            return (vec![0.0; lk], f64::NEG_INFINITY);
        }
        let z: f64 = s.iter().flatten().map(|v| (v - m).exp()).sum();
        (s.iter().map(|v| v.map_or(0.0, |v| (v - m).exp() / z)).collect(), m + z.ln())
    }

    /// The forward.
    pub fn forward(&self) -> AttnRef {
        let d = self.g.d;
        let mut o = vec![0.0; self.q.len()];
        let mut lse = vec![f64::NEG_INFINITY; self.g.lse_shape().iter().product()];
        for b in 0..self.g.batch {
            for h in 0..self.g.hq {
                for i in 0..self.g.q_spans[b].len {
                    let (p, l) = self.probs(b, h, i);
                    lse[self.g.lse_index(b, h, i)] = l;
                    let qa = self.qa(b, i, h);
                    for (j, pj) in p.iter().enumerate() {
                        // A masked key does not touch the output (a NaN in its v must not either).
                        if !visible(self.g, self.mask, self.window, b, i, j) {
                            continue;
                        }
                        let w = pj * attn_keep(self.g, self.p, self.seed, self.offset, b, h, i, j);
                        let ka = self.ka(b, j, h);
                        for t in 0..d {
                            o[qa + t] += w * self.v[ka + t];
                        }
                    }
                }
            }
        }
        AttnRef { o, lse }
    }

    /// The backward by the chain rule on the materialised probabilities: (dq, dk, dv).
    pub fn backward(&self, d_o: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let d = self.g.d;
        let (mut dq, mut dk, mut dv) = (vec![0.0; self.q.len()], vec![0.0; self.k.len()], vec![0.0; self.v.len()]);
        for b in 0..self.g.batch {
            for h in 0..self.g.hq {
                for i in 0..self.g.q_spans[b].len {
                    let (p, _) = self.probs(b, h, i);
                    let qa = self.qa(b, i, h);
                    let keep: Vec<f64> =
                        (0..p.len()).map(|j| attn_keep(self.g, self.p, self.seed, self.offset, b, h, i, j)).collect();
                    // dP_j = dO·v_j·keep_j; dS_j = P_j (dP_j − Σ_l P_l dP_l)
                    let dp: Vec<f64> = (0..p.len())
                        .map(|j| {
                            let ka = self.ka(b, j, h);
                            keep[j] * (0..d).map(|t| d_o[qa + t] * self.v[ka + t]).sum::<f64>()
                        })
                        .collect();
                    let dot: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                    for j in 0..p.len() {
                        if p[j] == 0.0 {
                            continue;
                        }
                        let ka = self.ka(b, j, h);
                        let ds = p[j] * (dp[j] - dot);
                        for t in 0..d {
                            dv[ka + t] += p[j] * keep[j] * d_o[qa + t];
                            dq[qa + t] += self.scale * ds * self.k[ka + t];
                            dk[ka + t] += self.scale * ds * self.q[qa + t];
                        }
                    }
                }
            }
        }
        (dq, dk, dv)
    }
}

/// RoPE forward on one head vector (first d_rot dims), written from the formulas.
pub fn rope_vec(x: &[f64], f: &[f64], interleaved: bool) -> Vec<f64> {
    let mut y = x.to_vec();
    let dr = f.len();
    if interleaved {
        for p in 0..dr / 2 {
            y[2 * p] = x[2 * p] * f[2 * p].cos() - x[2 * p + 1] * f[2 * p].sin();
            y[2 * p + 1] = x[2 * p + 1] * f[2 * p + 1].cos() + x[2 * p] * f[2 * p + 1].sin();
        }
    } else {
        let h = dr / 2;
        for j in 0..h {
            y[j] = x[j] * f[j].cos() - x[j + h] * f[j].sin();
            y[j + h] = x[j + h] * f[j + h].cos() + x[j] * f[j + h].sin();
        }
    }
    y
}

/// [`adam`] with the op's own hyper-parameters (each f32 widened to f64).
pub fn adam_step(p: f64, g: f64, m: f64, v: f64, h: &tefl_core::catalogue::AdamHyper) -> (f64, f64, f64) {
    let f = f64::from;
    adam(p, g, m, v, f(h.lr), f(h.beta1), f(h.beta2), f(h.eps), h.step, h.mode, h.bias_correction, f(h.weight_decay))
}

/// One Adam element step (TE/apex semantics); returns (p, m, v).
#[allow(clippy::too_many_arguments)]
pub fn adam(
    p: f64,
    g: f64,
    m: f64,
    v: f64,
    lr: f64,
    b1: f64,
    b2: f64,
    eps: f64,
    step: u32,
    mode: AdamMode,
    bc: bool,
    wd: f64,
) -> (f64, f64, f64) {
    let g = if mode == AdamMode::L2 { g + wd * p } else { g };
    let m = b1 * m + (1.0 - b1) * g;
    let v = b2 * v + (1.0 - b2) * g * g;
    let (c1, c2) = if bc { (1.0 - b1.powf(f64::from(step)), 1.0 - b2.powf(f64::from(step))) } else { (1.0, 1.0) };
    let mut u = (m / c1) / ((v / c2).sqrt() + eps);
    if mode == AdamMode::AdamW {
        u += wd * p;
    }
    (p - lr * u, m, v)
}

/// The nearest FP8 value by exhaustive search over the 256 codes (ties to the even code),
/// saturating to ±max: independent of the encoder under test.
pub fn fp8_nearest(format: Fp8Format, x: f64) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let max = f64::from(format.max());
    let x = x.clamp(-max, max);
    let mut best: Option<(f64, u8)> = None;
    for c in 0u16..256 {
        let c = c as u8;
        let v = f64::from(format.decode(c));
        if !v.is_finite() || (v == 0.0 && v.is_sign_negative() != x.is_sign_negative()) {
            continue;
        }
        let err = (v - x).abs();
        best = match best {
            None => Some((err, c)),
            Some((e, bc)) if err < e || (err == e && (c & 1) == 0 && (bc & 1) == 1) => Some((err, c)),
            keep => keep,
        };
    }
    best.map_or(0, |b| b.1)
}

/// What an FP8 output quantizer gives back for exact values `x`: each x·scale cast to the
/// nearest code of `fp8` (saturating), decoded and divided by `scale` again.
pub fn fp8_round(fp8: tefl_core::DType, x: &[f64], scale: f64) -> Vec<f64> {
    let f = Fp8Format::of(fp8).expect("an fp8 dtype");
    x.iter().map(|v| f64::from(f.decode(fp8_nearest(f, v * scale))) / scale).collect()
}

/// Delayed scaling: (new history, new scale, new scale_inv) on `[hist, n]`.
pub fn delayed_scaling(
    h: &[f64],
    n: usize,
    scale: &[f64],
    fp8_max: f64,
    margin: f64,
    algo: AmaxAlgo,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let hist = h.len() / n;
    let mut s = scale.to_vec();
    for j in 0..n {
        let col: Vec<f64> = (0..hist).map(|r| h[r * n + j]).collect();
        let amax = match algo {
            AmaxAlgo::Max => {
                if col.iter().any(|v| v.is_nan()) {
                    f64::NAN
                } else {
                    col.iter().fold(0.0f64, |a, &b| a.max(b))
                }
            }
            AmaxAlgo::MostRecent => col[0],
        };
        if amax.is_finite() && amax > 0.0 {
            s[j] = fp8_max / amax / 2f64.powf(margin);
        }
    }
    let inv = s.iter().map(|v| 1.0 / v).collect();
    let mut nh = vec![0.0; h.len()];
    for r in 0..hist {
        for j in 0..n {
            nh[r * n + j] = if r == 0 { 0.0 } else { h[((r + 1) % hist) * n + j] };
        }
    }
    (nh, s, inv)
}
