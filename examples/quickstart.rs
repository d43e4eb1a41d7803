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
//! ```sh
//! cargo run --release --example quickstart
//! cargo run --release --example quickstart -- --dtype bf16 --device cpu --hidden 512 --seq 256
//! ```

use std::process::ExitCode;
use std::time::Instant;

use tefl::catalogue::{AdamMode, AttnMask, QkvLayout};
use tefl::ops;
use tefl::{DType, Device, Tensor};

struct Options {
    device: Device,
    dtype: DType,
    batch: usize,
    seq: usize,
    hidden: usize,
    heads: usize,
    ffn: usize,
    steps: usize,
    lr: f32,
}

const USAGE: &str = "usage: quickstart [--device cpu|cuda:0|vulkan:0|best] [--dtype f32|bf16|f16] \
[--batch N] [--seq N] [--hidden N] [--heads N] [--ffn N] [--steps N] [--lr X]";

fn parse() -> Result<Options, String> {
    let mut o = Options {
        device: Device::best_available(),
        dtype: DType::F32,
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
            return Err(USAGE.into());
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let num = |v: &str| v.parse::<usize>().map_err(|_| format!("{flag}: {v:?} is not a positive integer"));
        match flag.as_str() {
            "--device" if value == "best" => o.device = Device::best_available(),
            "--device" => o.device = value.parse().map_err(|e| format!("--device: {e}"))?,
            "--dtype" => {
                o.dtype = value.parse().map_err(|e| format!("--dtype: {e}"))?;
                if !DType::FLOATS.contains(&o.dtype) {
                    return Err(format!("--dtype: {value} is not f32, bf16 or f16"));
                }
            }
            "--batch" => o.batch = num(&value)?,
            "--seq" => o.seq = num(&value)?,
            "--hidden" => o.hidden = num(&value)?,
            "--heads" => o.heads = num(&value)?,
            "--ffn" => o.ffn = num(&value)?,
            "--steps" => o.steps = num(&value)?,
            "--lr" => o.lr = value.parse().map_err(|_| format!("--lr: {value:?} is not a number"))?,
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
    }
    if [o.batch, o.seq, o.hidden, o.heads, o.ffn, o.steps].contains(&0) {
        return Err("sizes and --steps must be at least 1".into());
    }
    if !o.hidden.is_multiple_of(o.heads) || !(o.hidden / o.heads).is_multiple_of(2) {
        return Err(format!("--hidden {} must split into --heads {} of an even head dim", o.hidden, o.heads));
    }
    if !o.device.is_available() {
        return Err(format!("device {} is not available here", o.device));
    }
    Ok(o)
}

/// A deterministic generator, so every run trains on the same task from the same start.
struct Lcg(u64);
impl Lcg {
    fn uniform(&mut self, a: f32) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
    }
    fn vec(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(a)).collect()
    }
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

fn run() -> Result<(), String> {
    let o = parse()?;
    tefl::logging::init().map_err(|e| e.to_string())?;
    let err = |e: tefl::Error| e.to_string();
    let (b, s, h, nh, f) = (o.batch, o.seq, o.hidden, o.heads, o.ffn);
    let (d, rows) = (h / nh, b * s);
    let dev = o.device;
    let put = |v: &[f32], shape: &[usize], dt: DType| -> Result<Tensor, String> {
        Tensor::from_slice(v, shape, dt).and_then(|t| t.to_device(&dev)).map_err(err)
    };
    println!(
        "quickstart: one transformer block, batch {b}, seq {s}, hidden {h}, heads {nh}, ffn {f}, {} on {dev}",
        o.dtype
    );

    let mut rng = Lcg(0x7EF1);
    let xs = rng.vec(rows * h, 1.0);
    let mut target = vec![0.0f32; rows * h];
    for bi in 0..b {
        for t in 1..s {
            let (dst, src) = ((bi * s + t) * h, (bi * s + t - 1) * h);
            target[dst..dst + h].copy_from_slice(&xs[src..src + h]);
        }
    }
    let x = put(&xs, &[rows, h], o.dtype)?;
    let lin = |rng: &mut Lcg, out: usize, inp: usize| {
        put(&rng.vec(out * inp, 1.0 / (inp as f32).sqrt()), &[out, inp], o.dtype)
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
    let params = p.list();
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

    let mut losses = Vec::new();
    let mut times = Vec::new();
    for step in 1..=o.steps {
        let t0 = Instant::now();
        // ---- forward ----
        let n1 = ops::rmsnorm_fwd(&x, &p.g1, 1e-5).call().map_err(err)?;
        let proj = |w: &Tensor| ops::generic_gemm(&n1.y, w).transb(true).call().map(|o| o.d).map_err(err);
        let (q, k, vv) = (proj(&p.wq)?, proj(&p.wk)?, proj(&p.wv)?);
        let heads = |t: &Tensor| t.reshape([b, s, nh, d]).map_err(err);
        let rope =
            |t: &Tensor| ops::fused_rope_forward(t, &freqs).layout(QkvLayout::Bshd).call().map(|o| o.y).map_err(err);
        let (qr, kr, v4) = (rope(&heads(&q)?)?, rope(&heads(&k)?)?, heads(&vv)?);
        let attn = ops::fused_attn_fwd(&qr, &kr, &v4).mask(AttnMask::Causal).call().map_err(err)?;
        let a2 = attn.o.reshape([rows, h]).map_err(err)?;
        let x1 = ops::generic_gemm(&a2, &p.wo).transb(true).accumulate(&x).call().map_err(err)?.d;
        let n2 = ops::rmsnorm_fwd(&x1, &p.g2, 1e-5).call().map_err(err)?;
        let hg = ops::generic_gemm(&n2.y, &p.w1).transb(true).call().map_err(err)?.d;
        let act = ops::swiglu(&hg).call().map_err(err)?.y;
        let y = ops::generic_gemm(&act, &p.w2).transb(true).accumulate(&x1).call().map_err(err)?.d;

        // ---- loss (host) ----
        let yv = y.to_vec::<f32>().map_err(err)?;
        let nel = yv.len() as f32;
        let loss = yv.iter().zip(&target).map(|(a, t)| (a - t) * (a - t)).sum::<f32>() / nel;
        let dyv: Vec<f32> = yv.iter().zip(&target).map(|(a, t)| 2.0 * (a - t) / nel).collect();
        let dy = put(&dyv, &[rows, h], o.dtype)?;

        // ---- backward ----
        let gemm_nn = |a: &Tensor, w: &Tensor| ops::generic_gemm(a, w).call().map(|o| o.d).map_err(err);
        let wgrad =
            |dout: &Tensor, inp: &Tensor| ops::generic_gemm(dout, inp).transa(true).call().map(|o| o.d).map_err(err);
        let da = gemm_nn(&dy, &p.w2)?;
        let dw2 = wgrad(&dy, &act)?;
        let dhg = ops::dswiglu(&da, &hg).call().map_err(err)?.grad_input;
        let dn2 = gemm_nn(&dhg, &p.w1)?;
        let dw1 = wgrad(&dhg, &n2.y)?;
        let b2 = ops::rmsnorm_bwd_add(&dn2, &x1, &n2.rsigma, &p.g2, &dy).call().map_err(err)?;
        let dx1 = b2.dx;
        let dattn = gemm_nn(&dx1, &p.wo)?;
        let dwo = wgrad(&dx1, &a2)?;
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
        let t1 = gemm_nn(&dq, &p.wq)?;
        let t2 = ops::generic_gemm(&dk, &p.wk).accumulate(&t1).call().map_err(err)?.d;
        let dn1 = ops::generic_gemm(&dv, &p.wv).accumulate(&t2).call().map_err(err)?.d;
        let (dwq, dwk, dwv) = (wgrad(&dq, &n1.y)?, wgrad(&dk, &n1.y)?, wgrad(&dv, &n1.y)?);
        let b1 = ops::rmsnorm_bwd_add(&dn1, &x, &n1.rsigma, &p.g1, &dx1).call().map_err(err)?;

        // ---- AdamW ----
        let grads = vec![b1.dgamma, dwq, dwk, dwv, dwo, b2.dgamma, dw1, dw2];
        ops::multi_tensor_adam(&noop, &grads, &params, &m, &v, o.lr)
            .step(step as u32)
            .mode(AdamMode::AdamW)
            .weight_decay(0.01)
            .call()
            .map_err(err)?;
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
    Ok(())
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
