//! Trains one transformer block for 20 steps on a fixed synthetic task, every op dispatched
//! through tefl on the best available device (the CPU here):
//!
//! RMSNorm → Q/K/V GEMMs → RoPE → causal attention → output GEMM (+ residual, fused as
//! accumulate) → RMSNorm → SwiGLU MLP (+ residual) → MSE loss, the backward pass through the
//! same ops' backward forms, then an AdamW step with `multi_tensor_adam`.
//!
//! The task: predict, at each position, the previous position's input vector (which a
//! causal attention layer can learn). The loss is computed on the host from the block's output.
//!
//! `--dtype fp8` trains with FP8 GEMMs (TE's delayed-scaling recipe: e4m3 activations and
//! weights, e5m2 gradients, per-tensor scales from an amax history updated by
//! `fused_amax_and_scale_update_after_reduction`, the first step scaled from each tensor's own
//! amax, every GEMM in the TN form with the transposed codes `quantize` writes alongside) and
//! prints its loss curve beside a bf16 run from the same start.
//!
//! `--experts 8` replaces the MLP by a mixture of experts: a router GEMM, top-2 routing with
//! softmax-normalised gates, and the experts' SwiGLU MLPs forward and backward through
//! `te_general_grouped_gemm` (routing, token permutation and the weighted combine on the host).
//!
//! ```sh
//! cargo run --release --example quickstart
//! cargo run --release --example quickstart -- --dtype bf16 --device cpu --hidden 512 --seq 256
//! cargo run --release --example quickstart -- --dtype fp8
//! cargo run --release --example quickstart -- --experts 8
//! ```

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Instant;

use tefl::catalogue::{AdamMode, AttnMask, QkvLayout};
use tefl::fp8::Fp8Format;
use tefl::ops;
use tefl::{DType, Device, Tensor};

#[derive(Clone)]
struct Options {
    device: Device,
    dtype: DType,
    /// FP8 GEMMs (with bf16 everything else).
    fp8: bool,
    /// A mixture-of-experts MLP with this many experts (top-2 routing); 0: the dense MLP.
    experts: usize,
    batch: usize,
    seq: usize,
    hidden: usize,
    heads: usize,
    ffn: usize,
    steps: usize,
    lr: f32,
}

const USAGE: &str = "usage: quickstart [--device cpu|cuda:0|vulkan:0|best] [--dtype f32|bf16|f16|fp8] \
[--batch N] [--seq N] [--hidden N] [--heads N] [--ffn N] [--experts N] [--steps N] [--lr X]";

/// What the command line asks for: a run, or the usage text (`--help`).
enum Command {
    Run(Options),
    Help,
}

fn parse() -> Result<Command, String> {
    let mut o = Options {
        device: Device::best_available(),
        dtype: DType::F32,
        fp8: false,
        experts: 0,
        batch: 4,
        seq: 128,
        hidden: 256,
        heads: 4,
        ffn: 512,
        steps: 20,
        lr: 3e-3,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            return Ok(Command::Help);
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let num = |v: &str| v.parse::<usize>().map_err(|_| format!("{flag}: {v:?} is not a positive integer"));
        match flag.as_str() {
            "--device" if value == "best" => o.device = Device::best_available(),
            "--device" => o.device = value.parse().map_err(|e| format!("--device: {e}"))?,
            "--dtype" if value == "fp8" => {
                o.dtype = DType::BF16;
                o.fp8 = true;
            }
            "--dtype" => {
                o.dtype = value.parse().map_err(|e| format!("--dtype: {e}"))?;
                if !DType::FLOATS.contains(&o.dtype) {
                    return Err(format!("--dtype: {value} is not f32, bf16, f16 or fp8"));
                }
            }
            "--batch" => o.batch = num(&value)?,
            "--seq" => o.seq = num(&value)?,
            "--hidden" => o.hidden = num(&value)?,
            "--heads" => o.heads = num(&value)?,
            "--ffn" => o.ffn = num(&value)?,
            "--experts" => {
                o.experts = num(&value)?;
                if o.experts < 2 {
                    return Err(format!("--experts {value}: top-2 routing needs at least 2 experts"));
                }
            }
            "--steps" => o.steps = num(&value)?,
            "--lr" => {
                o.lr = value.parse().map_err(|_| format!("--lr: {value:?} is not a number"))?;
                if !(o.lr.is_finite() && o.lr > 0.0) {
                    return Err(format!("--lr {value}: the learning rate must be a positive number"));
                }
            }
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
    }
    if [o.batch, o.seq, o.hidden, o.heads, o.ffn, o.steps].contains(&0) {
        return Err("sizes and --steps must be at least 1".into());
    }
    if !o.hidden.is_multiple_of(o.heads) || !(o.hidden / o.heads).is_multiple_of(2) {
        return Err(format!("--hidden {} must split into --heads {} of an even head dim", o.hidden, o.heads));
    }
    // The largest tensors' element counts (tokens × hidden and × 2·ffn, the MLP's weights,
    // the RoPE angles), checked so that a huge size is an error here, not an overflow later.
    let tokens = o.batch.checked_mul(o.seq);
    let largest = [
        tokens.and_then(|t| t.checked_mul(o.hidden)),
        tokens.and_then(|t| t.checked_mul(o.ffn)).and_then(|n| n.checked_mul(2)),
        o.hidden.checked_mul(o.ffn).and_then(|n| n.checked_mul(2)),
        o.seq.checked_mul(o.hidden / o.heads),
    ];
    if largest.iter().any(|n| n.is_none_or(|n| n.checked_mul(4).is_none_or(|b| b > isize::MAX as usize))) {
        return Err(format!(
            "--batch {} --seq {} --hidden {} --ffn {}: the block's tensors would not fit in memory",
            o.batch, o.seq, o.hidden, o.ffn
        ));
    }
    if !o.device.is_available() {
        return Err(format!("device {} is not available here", o.device));
    }
    Ok(Command::Run(o))
}

/// A deterministic generator, so every run trains on the same task from the same start.
struct Lcg(u64);
impl Lcg {
    fn uniform(&mut self, a: f32) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
    }
    /// `n` values uniform in [-a, a) (a size the host cannot hold: an error, not an abort).
    fn vec(&mut self, n: usize, a: f32) -> Result<Vec<f32>, String> {
        let mut v = host_f32(n)?;
        v.iter_mut().for_each(|x| *x = self.uniform(a));
        Ok(v)
    }
}

/// `n` zeros on the host through tefl's fallible allocator: a size larger than the memory left
/// is an out-of-memory error naming the size, where `vec!` would abort the process.
fn host_f32(n: usize) -> Result<Vec<f32>, String> {
    tefl::device::try_zeroed::<f32>(n, || format!("{n} f32 values of the quickstart's data")).map_err(|e| e.to_string())
}

struct Params {
    g1: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    g2: Tensor,
    w1: Tensor,
    w2: Tensor,
}

impl Params {
    fn list(&self) -> Vec<Tensor> {
        vec![
            self.g1.clone(),
            self.wq.clone(),
            self.wk.clone(),
            self.wv.clone(),
            self.wo.clone(),
            self.g2.clone(),
            self.w1.clone(),
            self.w2.clone(),
        ]
    }
}

/// Indices of the FP8 operands: inputs and weights share the e4m3 scaling, output gradients
/// the e5m2 one.
const X_N1: usize = 0;
const X_A2: usize = 1;
const X_N2: usize = 2;
const X_ACT: usize = 3;
const W_Q: usize = 4;
const W_K: usize = 5;
const W_V: usize = 6;
const W_O: usize = 7;
const W_1: usize = 8;
const W_2: usize = 9;
const G_DY: usize = 0;
const G_DHG: usize = 1;
const G_DX1: usize = 2;
const G_DQ: usize = 3;
const G_DK: usize = 4;
const G_DV: usize = 5;
/// Steps of amax history (TE's `amax_history_len`).
const HISTORY: usize = 16;

/// TE's delayed scaling for a set of per-tensor scales: this step's amaxes go into row 0 of the
/// history, then `fused_amax_and_scale_update_after_reduction` computes the next scales and
/// rolls the history (on the run's device; the host keeps a copy between steps).
struct Scaling {
    format: Fp8Format,
    history: Vec<f32>,
    scale: Vec<f32>,
    amax: Vec<f32>,
}

impl Scaling {
    fn new(format: Fp8Format, n: usize) -> Self {
        Scaling { format, history: vec![0.0; HISTORY * n], scale: vec![1.0; n], amax: vec![0.0; n] }
    }

    fn update(&mut self, dev: &Device) -> Result<(), String> {
        let n = self.scale.len();
        self.history[..n].copy_from_slice(&self.amax);
        let put = |v: &[f32], shape: &[usize]| upload(v, shape, DType::F32, dev);
        let (h, s, si) = (put(&self.history, &[HISTORY, n])?, put(&self.scale, &[n])?, put(&vec![1.0; n], &[n])?);
        ops::fused_amax_and_scale_update_after_reduction(&h, &s, &si, self.format.max())
            .call()
            .map_err(|e| e.to_string())?;
        self.history = h.to_vec::<f32>().map_err(|e| e.to_string())?;
        self.scale = s.to_vec::<f32>().map_err(|e| e.to_string())?;
        self.amax.iter_mut().for_each(|a| *a = 0.0);
        Ok(())
    }
}

/// One operand in FP8: its codes, the transposed codes (for the backward's TN GEMMs) and the
/// scale_inv both share.
#[derive(Clone)]
struct Quantized {
    q: Tensor,
    q_t: Tensor,
    scale_inv: Tensor,
}

/// The FP8 state of a run: the two scalings and this step's quantized operands.
struct Fp8 {
    fwd: Scaling,
    bwd: Scaling,
    codes: HashMap<(bool, usize), Quantized>,
}

impl Fp8 {
    /// Operand `i` (a gradient when `grad`) in FP8, quantized once per step.
    fn get(&mut self, t: &Tensor, grad: bool, i: usize) -> Result<Quantized, String> {
        if let Some(q) = self.codes.get(&(grad, i)) {
            return Ok(q.clone());
        }
        let err = |e: tefl::Error| e.to_string();
        let sc = if grad { &mut self.bwd } else { &mut self.fwd };
        let n = sc.scale.len();
        if sc.history.iter().skip(i).step_by(n).all(|a| *a == 0.0) && sc.amax[i] == 0.0 {
            // No history yet (the first step): scale from this tensor's own amax, as TE's
            // current scaling does, rather than from the initial 1 (gradients of a mean loss
            // are far below e5m2's smallest normal).
            let amax = ops::compute_amax(t).call().map_err(err)?.amax.to_vec::<f32>().map_err(err)?[0];
            if amax.is_finite() && amax > 0.0 {
                sc.scale[i] = sc.format.max() / amax;
            }
        }
        let scale = Tensor::from_slice(&[sc.scale[i]], [1], DType::F32).and_then(|s| s.to_device(&t.device()));
        let out = ops::quantize(t, sc.format.dtype(), &scale.map_err(err)?).want_transpose(true).call().map_err(err)?;
        sc.amax[i] = sc.amax[i].max(out.amax.to_vec::<f32>().map_err(err)?[0]);
        let q_t = out.q_t.ok_or("quantize returned no transposed codes")?;
        let q = Quantized { q: out.q, q_t, scale_inv: out.scale_inv };
        self.codes.insert((grad, i), q.clone());
        Ok(q)
    }
}

/// The block's GEMMs in the run's precision: float GEMMs, or FP8 ones (TE's recipe: forward
/// e4m3 x e4m3 with fast accumulation, dgrad and wgrad e5m2 x e4m3 with split accumulation,
/// all TN from the kept transposed codes), every output in the float dtype.
struct Gemms {
    dtype: DType,
    fp8: Option<Fp8>,
}

impl Gemms {
    /// x·wᵀ (+ acc): a Linear's forward.
    fn fwd(&mut self, x: &Tensor, xi: usize, w: &Tensor, wi: usize, acc: Option<&Tensor>) -> Result<Tensor, String> {
        let call = match &mut self.fp8 {
            None => ops::generic_gemm(x, w).transb(true),
            Some(f) => {
                let (qx, qw) = (f.get(x, false, xi)?, f.get(w, false, wi)?);
                ops::generic_gemm(&qx.q, &qw.q).transb(true).fp8_scales(&qx.scale_inv, &qw.scale_inv)
            }
        };
        finish(call.out_dtype(self.dtype), acc)
    }

    /// dy·w (+ acc): the gradient of a Linear's input.
    fn dgrad(&mut self, dy: &Tensor, gi: usize, w: &Tensor, wi: usize, acc: Option<&Tensor>) -> Result<Tensor, String> {
        let call = match &mut self.fp8 {
            None => ops::generic_gemm(dy, w),
            Some(f) => {
                let (qg, qw) = (f.get(dy, true, gi)?, f.get(w, false, wi)?);
                ops::generic_gemm(&qg.q, &qw.q_t)
                    .transb(true)
                    .fp8_scales(&qg.scale_inv, &qw.scale_inv)
                    .split_accumulator(true)
            }
        };
        finish(call.out_dtype(self.dtype), acc)
    }

    /// dyᵀ·x: the gradient of a Linear's weight.
    fn wgrad(&mut self, dy: &Tensor, gi: usize, x: &Tensor, xi: usize) -> Result<Tensor, String> {
        let call = match &mut self.fp8 {
            None => ops::generic_gemm(dy, x).transa(true),
            Some(f) => {
                let (qg, qx) = (f.get(dy, true, gi)?, f.get(x, false, xi)?);
                ops::generic_gemm(&qg.q_t, &qx.q_t)
                    .transb(true)
                    .fp8_scales(&qg.scale_inv, &qx.scale_inv)
                    .split_accumulator(true)
            }
        };
        finish(call.out_dtype(self.dtype), None)
    }

    /// After a step: the next scales from this step's amaxes; the quantized operands expire.
    fn end_step(&mut self, dev: &Device) -> Result<(), String> {
        if let Some(f) = &mut self.fp8 {
            f.fwd.update(dev)?;
            f.bwd.update(dev)?;
            f.codes.clear();
        }
        Ok(())
    }
}

fn finish(call: ops::Call<tefl::catalogue::GenericGemm>, acc: Option<&Tensor>) -> Result<Tensor, String> {
    let call = match acc {
        Some(c) => call.accumulate(c),
        None => call,
    };
    call.call().map(|o| o.d).map_err(|e| e.to_string())
}

/// The mixture-of-experts MLP of `--experts E`: a router GEMM, top-2 routing whose two gates
/// are the softmax of the two chosen logits (Mixtral's), and the experts' SwiGLU MLPs, all
/// experts at once through `te_general_grouped_gemm`. Routing, the token permutation and the
/// weighted combine are done on the host (no load-balancing loss).
struct Moe {
    wr: Tensor,
    w1: Vec<Tensor>,
    w2: Vec<Tensor>,
}

/// What a MoE backward needs from its forward.
struct MoeSaved {
    /// Per token, its two (expert, row in that expert's batch, gate).
    routes: Vec<[(usize, usize, f32); 2]>,
    xe: Vec<Tensor>,
    he: Vec<Tensor>,
    acte: Vec<Tensor>,
    oe: Vec<Vec<f32>>,
}

fn host(t: &Tensor) -> Result<Vec<f32>, String> {
    t.to_vec::<f32>().map_err(|e| e.to_string())
}

fn upload(v: &[f32], shape: &[usize], dtype: DType, dev: &Device) -> Result<Tensor, String> {
    Tensor::from_slice(v, shape, dtype).and_then(|t| t.to_device(dev)).map_err(|e| e.to_string())
}

impl Moe {
    fn experts(&self) -> usize {
        self.w1.len()
    }

    fn params(&self) -> Vec<Tensor> {
        std::iter::once(self.wr.clone()).chain(self.w1.iter().cloned()).chain(self.w2.iter().cloned()).collect()
    }

    /// The MLP's output `[rows, h]` for the normalised input `x`.
    fn forward(&self, x: &Tensor) -> Result<(Tensor, MoeSaved), String> {
        let err = |e: tefl::Error| e.to_string();
        let (rows, h, e) = (x.shape()[0], x.shape()[1], self.experts());
        let (dt, dev) = (x.dtype(), x.device());
        let logits = host(&ops::generic_gemm(x, &self.wr).transb(true).out_dtype(DType::F32).call().map_err(err)?.d)?;
        let xv = host(x)?;
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); e];
        let mut routes = Vec::with_capacity(rows);
        for t in 0..rows {
            let l = &logits[t * e..(t + 1) * e];
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|a, b| l[*b].total_cmp(&l[*a]));
            let (e1, e2) = (order[0], order[1]);
            let z = (l[e2] - l[e1]).exp();
            let (g1, g2) = (1.0 / (1.0 + z), z / (1.0 + z));
            routes.push([(e1, members[e1].len(), g1), (e2, members[e2].len(), g2)]);
            members[e1].push(t);
            members[e2].push(t);
        }
        let xe = members
            .iter()
            .map(|toks| {
                let rows: Vec<f32> = toks.iter().flat_map(|&t| xv[t * h..(t + 1) * h].iter().copied()).collect();
                upload(&rows, &[toks.len(), h], dt, &dev)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let he = ops::grouped_gemm(&xe, &self.w1).transb(true).out_dtype(dt).call().map_err(err)?.d;
        let acte = he
            .iter()
            .map(|hg| match hg.shape()[0] {
                0 => Tensor::zeros([0, hg.shape()[1] / 2], dt, &dev).map_err(err),
                _ => ops::swiglu(hg).call().map(|o| o.y).map_err(err),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let oe_dev = ops::grouped_gemm(&acte, &self.w2).transb(true).out_dtype(dt).call().map_err(err)?.d;
        let oe = oe_dev.iter().map(host).collect::<Result<Vec<_>, _>>()?;
        let mut out = vec![0.0f32; rows * h];
        for (t, r) in routes.iter().enumerate() {
            for &(ex, row, gate) in r {
                let o = &oe[ex][row * h..(row + 1) * h];
                out[t * h..(t + 1) * h].iter_mut().zip(o).for_each(|(y, v)| *y += gate * v);
            }
        }
        Ok((upload(&out, &[rows, h], dt, &dev)?, MoeSaved { routes, xe, he, acte, oe }))
    }

    /// (dx, the gradients of `params()` in order) from the output gradient `dy`.
    fn backward(&self, s: &MoeSaved, x: &Tensor, dy: &Tensor) -> Result<(Tensor, Vec<Tensor>), String> {
        let err = |e: tefl::Error| e.to_string();
        let (rows, h, e) = (x.shape()[0], x.shape()[1], self.experts());
        let (dt, dev) = (x.dtype(), x.device());
        let dyv = host(dy)?;
        // Each expert row's output gradient (gate · dy) and the gates' gradients (dy · o).
        let mut doe: Vec<Vec<f32>> = s.oe.iter().map(|o| vec![0.0; o.len()]).collect();
        let mut dlogits = vec![0.0f32; rows * e];
        for (t, r) in s.routes.iter().enumerate() {
            let dyt = &dyv[t * h..(t + 1) * h];
            let mut dg = [0.0f32; 2];
            for (k, &(ex, row, gate)) in r.iter().enumerate() {
                let o = &s.oe[ex][row * h..(row + 1) * h];
                dg[k] = dyt.iter().zip(o).map(|(a, b)| a * b).sum();
                doe[ex][row * h..(row + 1) * h].iter_mut().zip(dyt).for_each(|(d, g)| *d = gate * g);
            }
            // The softmax over the two chosen logits, backward.
            let mean = r[0].2 * dg[0] + r[1].2 * dg[1];
            dlogits[t * e + r[0].0] = r[0].2 * (dg[0] - mean);
            dlogits[t * e + r[1].0] = r[1].2 * (dg[1] - mean);
        }
        let doe = doe.iter().map(|v| upload(v, &[v.len() / h, h], dt, &dev)).collect::<Result<Vec<_>, _>>()?;
        let dact = ops::grouped_gemm(&doe, &self.w2).out_dtype(dt).call().map_err(err)?.d;
        let dw2 = ops::grouped_gemm(&doe, &s.acte).transa(true).out_dtype(dt).call().map_err(err)?.d;
        let dhe = dact
            .iter()
            .zip(&s.he)
            .map(|(da, hg)| match hg.shape()[0] {
                0 => Tensor::zeros(hg.shape(), dt, &dev).map_err(err),
                _ => ops::dswiglu(da, hg).call().map(|o| o.grad_input).map_err(err),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let dxe = ops::grouped_gemm(&dhe, &self.w1).out_dtype(dt).call().map_err(err)?.d;
        let dw1 = ops::grouped_gemm(&dhe, &s.xe).transa(true).out_dtype(dt).call().map_err(err)?.d;
        // Un-permute: each token's two expert rows add into its gradient.
        let dxe = dxe.iter().map(host).collect::<Result<Vec<_>, _>>()?;
        let mut dx = vec![0.0f32; rows * h];
        for (t, r) in s.routes.iter().enumerate() {
            for &(ex, row, _) in r {
                dx[t * h..(t + 1) * h].iter_mut().zip(&dxe[ex][row * h..(row + 1) * h]).for_each(|(d, v)| *d += v);
            }
        }
        // The router: dx += dlogits · wr, dwr = dlogitsᵀ · x.
        let dl = upload(&dlogits, &[rows, e], dt, &dev)?;
        let dx = ops::generic_gemm(&dl, &self.wr)
            .accumulate(&upload(&dx, &[rows, h], dt, &dev)?)
            .out_dtype(dt)
            .call()
            .map_err(err)?
            .d;
        let dwr = ops::generic_gemm(&dl, x).transa(true).out_dtype(dt).call().map_err(err)?.d;
        Ok((dx, std::iter::once(dwr).chain(dw1).chain(dw2).collect()))
    }
}

fn run() -> Result<(), String> {
    let o = match parse()? {
        Command::Run(o) => o,
        Command::Help => {
            println!("{USAGE}");
            return Ok(());
        }
    };
    tefl::logging::init().map_err(|e| e.to_string())?;
    if !o.fp8 {
        return train(&o).map(|_| ());
    }
    // FP8 beside bf16, from the same start on the same data.
    let base = train(&Options { fp8: false, ..o.clone() })?;
    let fp8 = train(&o)?;
    println!("step  loss bf16  loss fp8   ms bf16   ms fp8");
    for (i, (b, f)) in base.iter().zip(&fp8).enumerate() {
        println!("{:>4}  {:>9.5}  {:>8.5}  {:>8.1}  {:>7.1}", i + 1, b.0, f.0, b.1 * 1e3, f.1 * 1e3);
    }
    let worst = base.iter().zip(&fp8).map(|(b, f)| ((f.0 - b.0) / b.0).abs()).fold(0.0f32, f32::max);
    println!("fp8 tracks bf16: largest relative loss difference {worst:.4}");
    Ok(())
}

/// The MLP's saved activations: the dense SwiGLU's, or the experts'.
enum Mlp {
    Dense { hg: Tensor, act: Tensor },
    Experts(MoeSaved),
}

/// Trains the block; returns (loss, seconds) per step.
fn train(o: &Options) -> Result<Vec<(f32, f64)>, String> {
    let err = |e: tefl::Error| e.to_string();
    let (b, s, h, nh, f) = (o.batch, o.seq, o.hidden, o.heads, o.ffn);
    let (d, rows) = (h / nh, b * s);
    let dev = o.device;
    let put = |v: &[f32], shape: &[usize], dt: DType| upload(v, shape, dt, &dev);
    println!(
        "quickstart: one transformer block, batch {b}, seq {s}, hidden {h}, heads {nh}, ffn {f}{}, {} on {dev}",
        if o.experts > 0 { format!(" x {} experts (top-2)", o.experts) } else { String::new() },
        if o.fp8 { "fp8 GEMMs (delayed scaling), bf16".to_string() } else { o.dtype.to_string() }
    );
    let mut g = Gemms {
        dtype: o.dtype,
        fp8: o.fp8.then(|| Fp8 {
            fwd: Scaling::new(Fp8Format::E4M3, 10),
            bwd: Scaling::new(Fp8Format::E5M2, 6),
            codes: HashMap::new(),
        }),
    };

    let mut rng = Lcg(0x7EF1);
    let xs = rng.vec(rows * h, 1.0)?;
    let mut target = host_f32(rows * h)?;
    for bi in 0..b {
        for t in 1..s {
            let (dst, src) = ((bi * s + t) * h, (bi * s + t - 1) * h);
            target[dst..dst + h].copy_from_slice(&xs[src..src + h]);
        }
    }
    let x = put(&xs, &[rows, h], o.dtype)?;
    let lin = |rng: &mut Lcg, out: usize, inp: usize| {
        put(&rng.vec(out * inp, 1.0 / (inp as f32).sqrt())?, &[out, inp], o.dtype)
    };
    let p = Params {
        g1: put(&vec![1.0; h], &[h], o.dtype)?,
        wq: lin(&mut rng, h, h)?,
        wk: lin(&mut rng, h, h)?,
        wv: lin(&mut rng, h, h)?,
        wo: lin(&mut rng, h, h)?,
        g2: put(&vec![1.0; h], &[h], o.dtype)?,
        w1: lin(&mut rng, 2 * f, h)?,
        w2: lin(&mut rng, h, f)?,
    };
    let moe = match o.experts {
        0 => None,
        e => Some(Moe {
            wr: lin(&mut rng, e, h)?,
            w1: (0..e).map(|_| lin(&mut rng, 2 * f, h)).collect::<Result<_, _>>()?,
            w2: (0..e).map(|_| lin(&mut rng, h, f)).collect::<Result<_, _>>()?,
        }),
    };
    // The dense MLP's weights train only without experts.
    let mut params = p.list();
    if let Some(moe) = &moe {
        params.truncate(6);
        params.extend(moe.params());
    }
    let zeros = |t: &Tensor| Tensor::zeros(t.shape(), DType::F32, &dev).map_err(err);
    let m: Vec<Tensor> = params.iter().map(zeros).collect::<Result<_, _>>()?;
    let v: Vec<Tensor> = params.iter().map(zeros).collect::<Result<_, _>>()?;
    let noop = put_i32(&[0], &dev)?;
    // RoPE angles: position t, pair j → t / 10000^(2j/d), the same on both halves.
    let freqs: Vec<f32> = (0..s * d)
        .map(|i| {
            let (t, j) = (i / d, i % d % (d / 2));
            t as f32 / 10000f32.powf(2.0 * j as f32 / d as f32)
        })
        .collect();
    let freqs = put(&freqs, &[s, d], DType::F32)?;

    // Kernels compile at their first call, one after another as the step reaches them; they
    // are started now instead, on other threads, while the first ops run (`warmup` picks the
    // impl as a call would and compiles what it launches, running nothing; a forward's warm-up
    // starts its backward's too; an impl with nothing to start ahead, the CPU's, answers
    // None). Any tensors of the calls' shapes and dtypes will do.
    let qkv = x.reshape([b, s, nh, d]).map_err(err)?;
    let lse = Tensor::zeros([b, nh, s], DType::F32, &dev).map_err(err)?;
    let gated = Tensor::uninit([rows, 2 * f], o.dtype, &dev).map_err(err)?;
    ops::rmsnorm_fwd(&x, &p.g1, 1e-5).warmup().map_err(err)?;
    ops::fused_rope_forward(&qkv, &freqs).layout(QkvLayout::Bshd).warmup().map_err(err)?;
    ops::swiglu(&gated).warmup().map_err(err)?;
    ops::fused_attn_fwd(&qkv, &qkv, &qkv).mask(AttnMask::Causal).warmup().map_err(err)?;
    ops::fused_attn_bwd(&qkv, &qkv, &qkv, &qkv, &qkv, &lse).mask(AttnMask::Causal).warmup().map_err(err)?;
    // (The gradients have the parameters' shapes and dtypes: the parameters stand in.)
    ops::multi_tensor_adam(&noop, &params, &params, &m, &v, o.lr)
        .mode(AdamMode::AdamW)
        .weight_decay(0.01)
        .warmup()
        .map_err(err)?;

    let mut losses = Vec::new();
    let mut times = Vec::new();
    for step in 1..=o.steps {
        let t0 = Instant::now();
        // ---- forward ----
        let n1 = ops::rmsnorm_fwd(&x, &p.g1, 1e-5).call().map_err(err)?;
        let q = g.fwd(&n1.y, X_N1, &p.wq, W_Q, None)?;
        let k = g.fwd(&n1.y, X_N1, &p.wk, W_K, None)?;
        let vv = g.fwd(&n1.y, X_N1, &p.wv, W_V, None)?;
        let heads = |t: &Tensor| t.reshape([b, s, nh, d]).map_err(err);
        let rope =
            |t: &Tensor| ops::fused_rope_forward(t, &freqs).layout(QkvLayout::Bshd).call().map(|o| o.y).map_err(err);
        let (qr, kr, v4) = (rope(&heads(&q)?)?, rope(&heads(&k)?)?, heads(&vv)?);
        let attn = ops::fused_attn_fwd(&qr, &kr, &v4).mask(AttnMask::Causal).call().map_err(err)?;
        let a2 = attn.o.reshape([rows, h]).map_err(err)?;
        let x1 = g.fwd(&a2, X_A2, &p.wo, W_O, Some(&x))?;
        let n2 = ops::rmsnorm_fwd(&x1, &p.g2, 1e-5).call().map_err(err)?;
        let (mlp, y) = match &moe {
            None => {
                let hg = g.fwd(&n2.y, X_N2, &p.w1, W_1, None)?;
                let act = ops::swiglu(&hg).call().map_err(err)?.y;
                let y = g.fwd(&act, X_ACT, &p.w2, W_2, Some(&x1))?;
                (Mlp::Dense { hg, act }, y)
            }
            Some(moe) => {
                let (out, saved) = moe.forward(&n2.y)?;
                let y: Vec<f32> = host(&x1)?.iter().zip(host(&out)?).map(|(a, b)| a + b).collect();
                (Mlp::Experts(saved), put(&y, &[rows, h], o.dtype)?)
            }
        };

        // ---- loss (host) ----
        let yv = y.to_vec::<f32>().map_err(err)?;
        let nel = yv.len() as f32;
        let loss = yv.iter().zip(&target).map(|(a, t)| (a - t) * (a - t)).sum::<f32>() / nel;
        let dyv: Vec<f32> = yv.iter().zip(&target).map(|(a, t)| 2.0 * (a - t) / nel).collect();
        let dy = put(&dyv, &[rows, h], o.dtype)?;

        // ---- backward ----
        let (dn2, mlp_grads) = match (&mlp, &moe) {
            (Mlp::Dense { hg, act }, _) => {
                let da = g.dgrad(&dy, G_DY, &p.w2, W_2, None)?;
                let dw2 = g.wgrad(&dy, G_DY, act, X_ACT)?;
                let dhg = ops::dswiglu(&da, hg).call().map_err(err)?.grad_input;
                let dn2 = g.dgrad(&dhg, G_DHG, &p.w1, W_1, None)?;
                let dw1 = g.wgrad(&dhg, G_DHG, &n2.y, X_N2)?;
                (dn2, vec![dw1, dw2])
            }
            (Mlp::Experts(saved), Some(moe)) => moe.backward(saved, &n2.y, &dy)?,
            (Mlp::Experts(_), None) => return Err("expert activations without experts".into()),
        };
        let b2 = ops::rmsnorm_bwd_add(&dn2, &x1, &n2.rsigma, &p.g2, &dy).call().map_err(err)?;
        let dx1 = b2.dx;
        let dattn = g.dgrad(&dx1, G_DX1, &p.wo, W_O, None)?;
        let dwo = g.wgrad(&dx1, G_DX1, &a2, X_A2)?;
        let ab =
            ops::fused_attn_bwd(&qr, &kr, &v4, &attn.o, &dattn.reshape([b, s, nh, d]).map_err(err)?, &attn.softmax_lse)
                .mask(AttnMask::Causal)
                .call()
                .map_err(err)?;
        let unrope = |t: &Tensor| {
            ops::fused_rope_backward(t, &freqs)
                .layout(QkvLayout::Bshd)
                .call()
                .map(|o| o.y)
                .map_err(err)?
                .reshape([rows, h])
                .map_err(err)
        };
        let (dq, dk, dv) = (unrope(&ab.dq)?, unrope(&ab.dk)?, ab.dv.reshape([rows, h]).map_err(err)?);
        let t1 = g.dgrad(&dq, G_DQ, &p.wq, W_Q, None)?;
        let t2 = g.dgrad(&dk, G_DK, &p.wk, W_K, Some(&t1))?;
        let dn1 = g.dgrad(&dv, G_DV, &p.wv, W_V, Some(&t2))?;
        let dwq = g.wgrad(&dq, G_DQ, &n1.y, X_N1)?;
        let dwk = g.wgrad(&dk, G_DK, &n1.y, X_N1)?;
        let dwv = g.wgrad(&dv, G_DV, &n1.y, X_N1)?;
        let b1 = ops::rmsnorm_bwd_add(&dn1, &x, &n1.rsigma, &p.g1, &dx1).call().map_err(err)?;

        // ---- AdamW ----
        let mut grads = vec![b1.dgamma, dwq, dwk, dwv, dwo, b2.dgamma];
        grads.extend(mlp_grads);
        ops::multi_tensor_adam(&noop, &grads, &params, &m, &v, o.lr)
            .step(step as u32)
            .mode(AdamMode::AdamW)
            .weight_decay(0.01)
            .call()
            .map_err(err)?;
        g.end_step(&dev)?;
        tefl::device::runtime(dev.kind).and_then(|r| r.synchronize(dev)).map_err(err)?;
        let dt = t0.elapsed().as_secs_f64();
        println!("step {step:>3}  loss {loss:.5}  {:.1} ms", dt * 1e3);
        losses.push(loss);
        times.push(dt);
    }
    let steady: Vec<f64> = times.iter().skip(1).copied().collect();
    let mean = if steady.is_empty() { times[0] } else { steady.iter().sum::<f64>() / steady.len() as f64 };
    println!(
        "loss {:.5} -> {:.5} over {} steps; {:.1} ms per step (mean after the first; first {:.1} ms)",
        losses[0],
        losses[losses.len() - 1],
        losses.len(),
        mean * 1e3,
        times[0] * 1e3
    );
    if losses.len() > 1 && losses[losses.len() - 1] >= losses[0] {
        return Err("the loss did not fall".into());
    }
    Ok(losses.into_iter().zip(times).collect())
}

fn put_i32(v: &[i32], dev: &Device) -> Result<Tensor, String> {
    Tensor::from_slice(v, [v.len()], DType::I32).and_then(|t| t.to_device(dev)).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
