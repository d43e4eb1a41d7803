//! `torch_oracle <backend> <dir>`: runs rmsnorm fwd/bwd, layernorm fwd/bwd, gemm, attention
//! fwd/bwd, swiglu fwd/bwd and adam (and, where the impl has them, the FP8 GEMM, the grouped
//! GEMM and RMSNorm with an FP8 output) on the backend's impl with fresh random inputs, and
//! writes every input and output (raw little-endian f32) with a `manifest.json` to `<dir>`.
//! `tests/torch_oracle.py <dir>` then recomputes each case with PyTorch in float64 from the
//! same inputs and prints the errors: torch as an independent oracle.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{Value, json};
use tefl_core::catalogue::*;
use tefl_core::{DType, Device, Manager, Registry, Result, Tensor};

struct Run {
    mgr: Manager,
    impl_id: String,
    device: Device,
    dir: PathBuf,
    state: u64,
    cases: Vec<Value>,
}

impl Run {
    fn uniform(&mut self) -> f32 {
        // xorshift64*: fresh inputs from the seed.
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let x = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (x >> 40) as f32 / (1u64 << 24) as f32
    }

    /// A random device tensor in [lo, hi).
    fn rand(&mut self, shape: &[usize], dtype: DType, lo: f32, hi: f32) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| lo + (hi - lo) * self.uniform()).collect();
        Tensor::from_slice(&v, shape, dtype)?.to_device(&self.device)
    }

    /// Writes a tensor's values (as f32) to `<case>.<name>.f32`; returns the file name.
    fn dump(&self, case: &str, name: &str, t: &Tensor) -> Result<String> {
        let v: Vec<f32> = t.to_vec()?;
        let file = format!("{case}.{name}.f32");
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        fs::write(self.dir.join(&file), bytes).map_err(|e| tefl_core::Error::Io {
            path: self.dir.join(&file).display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(file)
    }

    fn record(&mut self, case: &str, op: &str, dtype: DType, params: Value, tensors: &[(&str, &Tensor)]) -> Result<()> {
        let mut files = serde_json::Map::new();
        for (name, t) in tensors {
            files.insert(name.to_string(), json!({ "file": self.dump(case, name, t)?, "shape": t.shape() }));
        }
        self.cases
            .push(json!({ "case": case, "op": op, "dtype": dtype.to_string(), "params": params, "tensors": files }));
        Ok(())
    }

    fn call<O: tefl_core::Op>(&self, args: &O::Args) -> Result<O::Output> {
        self.mgr.call_impl::<O>(&self.impl_id, args)
    }
}

fn norms(r: &mut Run, dtype: DType) -> Result<()> {
    let (rows, n) = (1000, 4096);
    let x = r.rand(&[rows, n], dtype, -2.0, 2.0)?;
    let gamma = r.rand(&[n], dtype, 0.5, 1.5)?;
    let beta = r.rand(&[n], dtype, -0.5, 0.5)?;
    let dy = r.rand(&[rows, n], dtype, -1.0, 1.0)?;
    let eps = 1e-5;
    let f = r.call::<RmsNormFwd>(&RmsNormFwdArgs {
        scale: None,
        x: x.clone(),
        gamma: gamma.clone(),
        eps,
        zero_centered_gamma: false,
        out_dtype: dtype,
    })?;
    let b = r.call::<RmsNormBwd>(&RmsNormBwdArgs {
        dy: dy.clone(),
        x: x.clone(),
        rsigma: f.rsigma.clone(),
        gamma: gamma.clone(),
        zero_centered_gamma: false,
    })?;
    let case = format!("rmsnorm_{dtype}");
    r.record(
        &case,
        "rmsnorm",
        dtype,
        json!({ "eps": eps }),
        &[("x", &x), ("gamma", &gamma), ("dy", &dy), ("y", &f.y), ("dx", &b.dx), ("dgamma", &b.dgamma)],
    )?;
    let f = r.call::<LayerNormFwd>(&LayerNormFwdArgs {
        scale: None,
        x: x.clone(),
        gamma: gamma.clone(),
        beta: beta.clone(),
        eps,
        zero_centered_gamma: false,
        out_dtype: dtype,
    })?;
    let b = r.call::<LayerNormBwd>(&LayerNormBwdArgs {
        dy: dy.clone(),
        x: x.clone(),
        mu: f.mu.clone(),
        rsigma: f.rsigma.clone(),
        gamma: gamma.clone(),
        zero_centered_gamma: false,
    })?;
    let case = format!("layernorm_{dtype}");
    r.record(
        &case,
        "layernorm",
        dtype,
        json!({ "eps": eps }),
        &[
            ("x", &x),
            ("gamma", &gamma),
            ("beta", &beta),
            ("dy", &dy),
            ("y", &f.y),
            ("dx", &b.dx),
            ("dgamma", &b.dgamma),
            ("dbeta", &b.dbeta),
        ],
    )
}

fn gemm(r: &mut Run, dtype: DType) -> Result<()> {
    let (m, k, n) = (512, 1024, 768);
    for (transa, transb) in [(false, true), (true, false)] {
        let a = r.rand(&if transa { [k, m] } else { [m, k] }, dtype, -1.0, 1.0)?;
        let b = r.rand(&if transb { [n, k] } else { [k, n] }, dtype, -1.0, 1.0)?;
        let bias = r.rand(&[n], dtype, -1.0, 1.0)?;
        let out = r.call::<GenericGemm>(&GemmArgs {
            a_scale_inv: None,
            b_scale_inv: None,
            d_scale: None,
            split_accumulator: false,
            a: a.clone(),
            b: b.clone(),
            bias: Some(bias.clone()),
            aux: None,
            c: None,
            transa,
            transb,
            alpha: 1.0,
            accumulate: false,
            epilogue: GemmEpilogue::Bias,
            out_dtype: dtype,
        })?;
        let case = format!("gemm_{dtype}_{}{}", if transa { "T" } else { "N" }, if transb { "T" } else { "N" });
        r.record(
            &case,
            "gemm",
            dtype,
            json!({ "transa": transa, "transb": transb }),
            &[("a", &a), ("b", &b), ("bias", &bias), ("d", &out.d)],
        )?;
    }
    Ok(())
}

/// The FP8 ops (when the impl registers them): an FP8 GEMM (e4m3 x e4m3 and e5m2 x e4m3, TN,
/// bf16 D), a grouped GEMM over uneven groups (bf16 and FP8), and RMSNorm with an e4m3 output.
/// FP8 tensors are written decoded (their exact values); scales go in the params.
fn fp8(r: &mut Run) -> Result<()> {
    let scalar = |r: &Run, v: f32| Tensor::from_slice(&[v], [1], DType::F32)?.to_device(&r.device);
    let (m, k, n) = (384, 512, 640);
    for (fa, fb) in [(DType::F8E4M3, DType::F8E4M3), (DType::F8E5M2, DType::F8E4M3)] {
        let a = r.rand(&[m, k], fa, -3.0, 3.0)?;
        let b = r.rand(&[n, k], fb, -3.0, 3.0)?;
        let (sa, sb) = (0.5f32, 0.25f32);
        let out = r.call::<GenericGemm>(&GemmArgs {
            a_scale_inv: Some(scalar(r, sa)?),
            b_scale_inv: Some(scalar(r, sb)?),
            transb: true,
            ..GemmArgs::new(a.clone(), b.clone())
        })?;
        let case = format!("gemm_{fa}x{fb}_TN");
        r.record(
            &case,
            "gemm_fp8",
            DType::BF16,
            json!({ "sa": sa, "sb": sb }),
            &[("a", &a), ("b", &b), ("d", &out.d)],
        )?;
    }
    for dtype in [DType::BF16, DType::F8E4M3] {
        let (kk, nn) = (256, 384);
        let ms = [200, 0, 57, 311];
        let (mut a, mut b, mut sa, mut sb) = (vec![], vec![], vec![], vec![]);
        for &mg in &ms {
            a.push(r.rand(&[mg, kk], dtype, -2.0, 2.0)?);
            b.push(r.rand(&[nn, kk], dtype, -2.0, 2.0)?);
            if dtype.is_fp8() {
                sa.push(scalar(r, 0.5)?);
                sb.push(scalar(r, 0.5)?);
            }
        }
        let out = r.call::<GroupedGemm>(&GroupedGemmArgs {
            a: a.clone(),
            b: b.clone(),
            a_scale_inv: sa,
            b_scale_inv: sb,
            bias: vec![],
            transa: false,
            transb: true,
            out_dtype: DType::BF16,
            split_accumulator: true,
        })?;
        let names: Vec<[String; 3]> =
            (0..ms.len()).map(|g| [format!("a{g}"), format!("b{g}"), format!("d{g}")]).collect();
        let mut tensors: Vec<(&str, &Tensor)> = Vec::new();
        for (g, nm) in names.iter().enumerate() {
            tensors.extend([(nm[0].as_str(), &a[g]), (nm[1].as_str(), &b[g]), (nm[2].as_str(), &out.d[g])]);
        }
        let scale = if dtype.is_fp8() { 0.25 } else { 1.0 };
        r.record(
            &format!("grouped_{dtype}"),
            "grouped",
            DType::BF16,
            json!({ "groups": ms.len(), "scale": scale }),
            &tensors,
        )?;
    }
    let (rows, n) = (1000, 4096);
    let x = r.rand(&[rows, n], DType::BF16, -2.0, 2.0)?;
    let gamma = r.rand(&[n], DType::BF16, 0.5, 1.5)?;
    let sc = 32.0f32;
    let out = r.call::<RmsNormFwd>(&RmsNormFwdArgs {
        x: x.clone(),
        gamma: gamma.clone(),
        eps: 1e-5,
        zero_centered_gamma: false,
        out_dtype: DType::F8E4M3,
        scale: Some(scalar(r, sc)?),
    })?;
    let amax = out.amax.ok_or_else(|| tefl_core::Error::Tensor("rmsnorm_fwd fp8: no amax".into()))?;
    r.record(
        "rmsnorm_fp8_e4m3",
        "rmsnorm_fp8",
        DType::F8E4M3,
        json!({ "eps": 1e-5, "scale": sc }),
        &[("x", &x), ("gamma", &gamma), ("y", &out.y), ("amax", &amax)],
    )
}

fn attention(r: &mut Run, dtype: DType) -> Result<()> {
    // (causal, (b, s, hq, hk, d), cumulative lengths): bshd batches, then three sequences packed
    // as thd (b is then 1, s the total tokens).
    for (causal, (b, s, hq, hk, d), cu) in [
        (true, (2, 300, 8, 2, 128), None),
        (false, (1, 257, 4, 4, 64), None),
        (true, (1, 200, 4, 2, 256), None),
        (true, (1, 600, 4, 2, 128), Some(vec![0, 300, 357, 600])),
    ] {
        let shape = |h: usize| if cu.is_some() { vec![s, h, d] } else { vec![b, s, h, d] };
        let q = r.rand(&shape(hq), dtype, -1.0, 1.0)?;
        let k = r.rand(&shape(hk), dtype, -1.0, 1.0)?;
        let v = r.rand(&shape(hk), dtype, -1.0, 1.0)?;
        let d_o = r.rand(&shape(hq), dtype, -1.0, 1.0)?;
        let scale = 1.0 / (d as f32).sqrt();
        let cu_t = cu
            .as_ref()
            .map(|c: &Vec<i32>| Tensor::from_slice(c, [c.len()], DType::I32)?.to_device(&r.device))
            .transpose()?;
        let (layout, mask, kind) = match (&cu, causal) {
            (Some(_), _) => (QkvLayout::Thd, AttnMask::PaddingCausal, "thd_causal_gqa"),
            (None, true) => (QkvLayout::Bshd, AttnMask::Causal, "causal_gqa"),
            (None, false) => (QkvLayout::Bshd, AttnMask::None, "full"),
        };
        let fwd = AttnFwdArgs {
            q: q.clone(),
            k: k.clone(),
            v: v.clone(),
            cu_seqlens_q: cu_t.clone(),
            cu_seqlens_kv: cu_t,
            layout,
            mask,
            scale,
            dropout_p: 0.0,
            seed: 0,
            offset: 0,
            window: AttnWindow::default(),
            max_seqlen_q: None,
            max_seqlen_kv: None,
        };
        let f = r.call::<FusedAttnFwd>(&fwd)?;
        // The backward as it runs by default, and asking for a deterministic dQ (another
        // kernel pair: dK / dV without dQ shares, then a dQ pass over each query tile's keys).
        for deterministic in [false, true] {
            let args = AttnBwdArgs { deterministic, ..fwd.backward(f.o.clone(), d_o.clone(), f.softmax_lse.clone()) };
            let g = r.call::<FusedAttnBwd>(&args)?;
            let tag = if deterministic { "_deterministic" } else { "" };
            let case = format!("attention_{dtype}_{kind}_d{d}{tag}");
            r.record(
                &case,
                "attention",
                dtype,
                json!({ "causal": causal, "scale": scale, "cu": cu }),
                &[
                    ("q", &q),
                    ("k", &k),
                    ("v", &v),
                    ("d_o", &d_o),
                    ("o", &f.o),
                    ("lse", &f.softmax_lse),
                    ("dq", &g.dq),
                    ("dk", &g.dk),
                    ("dv", &g.dv),
                ],
            )?;
        }
    }
    Ok(())
}

fn swiglu(r: &mut Run, dtype: DType) -> Result<()> {
    let (rows, n) = (1000, 2048);
    let x = r.rand(&[rows, 2 * n], dtype, -3.0, 3.0)?;
    let grad = r.rand(&[rows, n], dtype, -1.0, 1.0)?;
    let y = r.call::<Swiglu>(&ActArgs { x: x.clone() })?.y;
    let gi = r.call::<DSwiglu>(&DActArgs { grad: grad.clone(), input: x.clone() })?.grad_input;
    r.record(
        &format!("swiglu_{dtype}"),
        "swiglu",
        dtype,
        json!({}),
        &[("x", &x), ("grad", &grad), ("y", &y), ("dx", &gi)],
    )
}

fn adam(r: &mut Run) -> Result<()> {
    let n = 1_000_003;
    let p = r.rand(&[n], DType::F32, -1.0, 1.0)?;
    let g = r.rand(&[n], DType::F32, -0.1, 0.1)?;
    let m = r.rand(&[n], DType::F32, -0.01, 0.01)?;
    let v = r.rand(&[n], DType::F32, 0.0, 1e-3)?;
    // Inputs are recorded before the in-place step, as host copies of their own: `to_device`
    // shares the storage of a tensor already on the host (the reference backend's), which the
    // step would then update too.
    let host_copy = |t: &Tensor| Tensor::from_slice(&t.to_vec::<f32>()?, t.shape(), DType::F32);
    let (p0, m0, v0) = (host_copy(&p)?, host_copy(&m)?, host_copy(&v)?);
    let hyper = AdamHyper {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        step: 3,
        mode: AdamMode::AdamW,
        bias_correction: true,
        weight_decay: 0.01,
    };
    let noop = Tensor::from_slice(&[0i32], [1], DType::I32)?.to_device(&r.device)?;
    r.call::<MultiTensorAdam>(&MultiTensorAdamArgs {
        noop_flag: noop,
        grads: vec![g.clone()],
        params: vec![p.clone()],
        exp_avg: vec![m.clone()],
        exp_avg_sq: vec![v.clone()],
        hyper,
    })?;
    r.record(
        "adamw_f32",
        "adamw",
        DType::F32,
        json!({ "lr": hyper.lr, "beta1": hyper.beta1, "beta2": hyper.beta2, "eps": hyper.eps, "step": hyper.step, "weight_decay": hyper.weight_decay }),
        &[("p0", &p0), ("g", &g), ("m0", &m0), ("v0", &v0), ("p", &p), ("m", &m), ("v", &v)],
    )
}

fn run(backend: &str, dir: &Path) -> std::result::Result<(), String> {
    let mgr = Manager::new(Registry::with_builtins(), Default::default());
    let impl_id = mgr
        .with_registry(|r| {
            r.all_impls()
                .find(|i| {
                    i.backend_name().eq_ignore_ascii_case(backend) && i.op() == "generic_gemm" && !i.is_by_name_only()
                })
                .map(|i| (i.impl_id().to_string(), i.device_kind()))
        })
        .ok_or_else(|| format!("backend '{backend}' has no generic_gemm impl in this build"))?;
    fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let seed = tefl_tests::seed("torch_oracle");
    println!("torch_oracle: {} on {}:0, seed {seed}", impl_id.0, impl_id.1);
    let mut r = Run {
        mgr,
        impl_id: impl_id.0,
        device: Device::new(impl_id.1, 0),
        dir: dir.into(),
        state: seed | 1,
        cases: vec![],
    };
    let e = |x: tefl_core::Error| x.to_string();
    for dtype in [DType::BF16, DType::F32] {
        norms(&mut r, dtype).map_err(e)?;
        gemm(&mut r, dtype).map_err(e)?;
        attention(&mut r, dtype).map_err(e)?;
        swiglu(&mut r, dtype).map_err(e)?;
    }
    adam(&mut r).map_err(e)?;
    let has_fp8 = r
        .mgr
        .with_registry(|reg| reg.all_impls().any(|i| i.impl_id() == r.impl_id && i.op() == "te_general_grouped_gemm"));
    if has_fp8 {
        fp8(&mut r).map_err(e)?;
    }
    let manifest = json!({ "impl": r.impl_id, "seed": seed, "cases": r.cases });
    fs::write(dir.join("manifest.json"), serde_json::to_vec_pretty(&manifest).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    println!("torch_oracle: {} cases written to {}", r.cases.len(), dir.display());
    Ok(())
}

const USAGE: &str = "usage: torch_oracle <backend> <dir>   (then: python3 tests/torch_oracle.py <dir>)";

fn main() -> ExitCode {
    let help = format!(
        "{USAGE}\n\nRuns the oracle's cases on the backend's impl and writes their inputs and outputs to <dir>;\ntests/torch_oracle.py then recomputes each in float64 with PyTorch."
    );
    let args = match tefl_tests::cli::start(&help) {
        Ok(args) => args,
        Err(done) => return done,
    };
    let [backend, dir] = args.as_slice() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    match run(&backend.to_ascii_lowercase(), Path::new(dir)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("torch_oracle: {e}");
            ExitCode::FAILURE
        }
    }
}
