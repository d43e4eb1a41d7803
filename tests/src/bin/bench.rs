//! `bench [--backend X] [--shapes anchor|small] [--vs torch] [--json FILE] [--reps N]`: times
//! each op of the anchor table (`shared/device/README.md`) on the backend's device: 3 s of
//! back-to-back calls as warm-up, then the median of repeated runs, each a batch of calls made
//! back to back (about 20 ms) timed by the device runtime (CUDA events on cuda, timestamp
//! queries on Vulkan) and divided by its size. Reports GB/s (each
//! input read once, each output written once) or TFLOP/s, and the fraction of a copy's
//! bandwidth measured in the same run. With `--vs torch` (python3 with torch), the torch
//! equivalents run in the same process tree on the same shapes, and the tefl/torch time
//! ratio is printed. `--only SUBSTRING` keeps the matching cases. `cargo xtask bench` runs it.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use tefl_core::catalogue::*;
use tefl_core::{DType, Device, Manager, Op, Registry, Tensor};

struct Case {
    name: String,
    torch: String,
    bytes: f64,
    flops: f64,
    run: Box<dyn Fn() -> tefl_core::Result<()>>,
}

struct Ctx {
    mgr: &'static Manager,
    impl_id: String,
    device: Device,
}

impl Ctx {
    fn t(&self, shape: &[usize], dtype: DType) -> tefl_core::Result<Tensor> {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| ((i % 1013) as f32 / 1013.0 - 0.5) * 0.5).collect();
        Tensor::from_slice(&v, shape, dtype)?.to_device(&self.device)
    }
    fn case<O: Op>(&self, name: String, torch: String, bytes: f64, flops: f64, args: O::Args) -> Case
    where
        O::Args: 'static,
    {
        let mgr = self.mgr;
        let id = self.impl_id.clone();
        Case { name, torch, bytes, flops, run: Box::new(move || mgr.call_impl::<O>(&id, &args).map(|_| ())) }
    }
}

fn cases(c: &Ctx, small: bool) -> tefl_core::Result<Vec<Case>> {
    let bf = DType::BF16;
    let (r, n) = if small { (4096, 4096) } else { (16384, 8192) };
    let mut v = Vec::new();
    let (x, g) = (c.t(&[r, n], bf)?, c.t(&[n], bf)?);
    let e = 2.0;
    let rn = (r * n) as f64;
    v.push(c.case::<RmsNormFwd>(
        format!("rmsnorm_fwd {r}x{n}"),
        format!("rmsnorm_fwd {r} {n}"),
        e * 2.0 * rn,
        0.0,
        RmsNormFwdArgs { x: x.clone(), gamma: g.clone(), eps: 1e-5, zero_centered_gamma: false, out_dtype: bf },
    ));
    if !small {
        let (x2, g2) = (c.t(&[8192, 4096], bf)?, c.t(&[4096], bf)?);
        v.push(c.case::<RmsNormFwd>(
            "rmsnorm_fwd 8192x4096".into(),
            "rmsnorm_fwd 8192 4096".into(),
            e * 2.0 * 8192.0 * 4096.0,
            0.0,
            RmsNormFwdArgs { x: x2, gamma: g2, eps: 1e-5, zero_centered_gamma: false, out_dtype: bf },
        ));
    }
    let rs = c.t(&[r], DType::F32)?;
    v.push(c.case::<RmsNormBwd>(
        format!("rmsnorm_bwd {r}x{n}"),
        format!("rmsnorm_bwd {r} {n}"),
        e * 3.0 * rn,
        0.0,
        RmsNormBwdArgs { dy: x.clone(), x: x.clone(), rsigma: rs, gamma: g.clone(), zero_centered_gamma: false },
    ));
    v.push(c.case::<LayerNormFwd>(
        format!("layernorm_fwd {r}x{n}"),
        format!("layernorm_fwd {r} {n}"),
        e * 2.0 * rn,
        0.0,
        LayerNormFwdArgs {
            x: x.clone(),
            gamma: g.clone(),
            beta: g.clone(),
            eps: 1e-5,
            zero_centered_gamma: false,
            out_dtype: bf,
        },
    ));
    v.push(c.case::<Gelu>(
        format!("gelu {r}x{n}"),
        format!("gelu {r} {n}"),
        e * 2.0 * rn,
        0.0,
        ActArgs { x: x.clone() },
    ));
    let x2n = c.t(&[r, 2 * n], bf)?;
    v.push(c.case::<Swiglu>(
        format!("swiglu {r}x{n}"),
        format!("swiglu {r} {n}"),
        e * 3.0 * rn,
        0.0,
        ActArgs { x: x2n },
    ));
    v.push(c.case::<ScaledSoftmaxForward>(
        format!("softmax {r}x{n}"),
        format!("softmax {r} {n}"),
        e * 2.0 * rn,
        0.0,
        SoftmaxArgs { x: x.reshape([1, 1, r, n])?, scale: 0.125 },
    ));
    let (s, b, h, d) = if small { (1024, 2, 8, 128) } else { (4096, 4, 32, 128) };
    let xr = c.t(&[s, b, h, d], bf)?;
    let fr = c.t(&[s, d], DType::F32)?;
    v.push(c.case::<FusedRopeForward>(
        format!("rope_fwd s{s} b{b} h{h} d{d}"),
        format!("rope {s} {b} {h} {d}"),
        e * 2.0 * (s * b * h * d) as f64 + 4.0 * (s * d) as f64,
        0.0,
        RopeArgs {
            x: xr,
            freqs: fr,
            cu_seqlens: None,
            start_positions: None,
            layout: QkvLayout::Sbhd,
            interleaved: false,
        },
    ));
    let sizes: &[usize] = if small { &[1024, 2048] } else { &[4096, 8192] };
    // bf16 at each size, and f16 at the first (backends whose fast paths differ by dtype: Vulkan's
    // cooperative matrices need VK_KHR_shader_bfloat16 for bf16).
    let gemms = sizes.iter().map(|&m| (m, bf, "")).chain([(sizes[0], DType::F16, " f16")]);
    for (m, dt, tag) in gemms {
        let a = c.t(&[m, m], dt)?;
        v.push(c.case::<GenericGemm>(
            format!("gemm{tag} {m}^3"),
            format!("gemm{} {m}", tag.replace(' ', "_")),
            0.0,
            2.0 * (m as f64).powi(3),
            GemmArgs {
                a: a.clone(),
                b: a,
                bias: None,
                aux: None,
                c: None,
                transa: false,
                transb: false,
                alpha: 1.0,
                accumulate: false,
                epilogue: GemmEpilogue::None,
                out_dtype: dt,
            },
        ));
    }
    let (ab, ah, asq, ad) = if small { (1, 8, 1024, 128) } else { (4, 32, 4096, 128) };
    let q = c.t(&[ab, asq, ah, ad], bf)?;
    let fwd_flops = 4.0 * (ab * ah) as f64 * (asq as f64).powi(2) * ad as f64 / 2.0;
    let fwd = AttnFwdArgs {
        q: q.clone(),
        k: q.clone(),
        v: q.clone(),
        cu_seqlens_q: None,
        cu_seqlens_kv: None,
        layout: QkvLayout::Bshd,
        mask: AttnMask::Causal,
        scale: 1.0 / (ad as f32).sqrt(),
        dropout_p: 0.0,
        seed: 0,
        offset: 0,
        window: AttnWindow::default(),
    };
    let out = c.mgr.call_impl::<FusedAttnFwd>(&c.impl_id, &fwd);
    v.push(c.case::<FusedAttnFwd>(
        format!("attn_fwd causal b{ab} h{ah} s{asq} d{ad}"),
        format!("attn_fwd {ab} {ah} {asq} {ad}"),
        0.0,
        fwd_flops,
        fwd.clone(),
    ));
    if let Ok(o) = out {
        v.push(c.case::<FusedAttnBwd>(
            format!("attn_bwd causal b{ab} h{ah} s{asq} d{ad}"),
            format!("attn_bwd {ab} {ah} {asq} {ad}"),
            0.0,
            2.5 * fwd_flops,
            fwd.backward(o.o, q.clone(), o.softmax_lse),
        ));
    }
    let np = if small { 16 << 20 } else { 256 << 20 };
    let p = c.t(&[np], DType::F32)?;
    let (gr, m, vv) = (c.t(&[np], DType::F32)?, c.t(&[np], DType::F32)?, c.t(&[np], DType::F32)?);
    v.push(c.case::<MultiTensorAdam>(
        format!("adam {}M f32 params", np >> 20),
        format!("adam {np}"),
        7.0 * 4.0 * np as f64,
        0.0,
        MultiTensorAdamArgs {
            noop_flag: Tensor::from_slice(&[0i32], [1], DType::I32)?.to_device(&c.device)?,
            grads: vec![gr],
            params: vec![p],
            exp_avg: vec![m],
            exp_avg_sq: vec![vv],
            hyper: AdamHyper {
                lr: 1e-4,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                step: 1,
                mode: AdamMode::AdamW,
                bias_correction: true,
                weight_decay: 0.0,
            },
        },
    ));
    Ok(v)
}

/// Warm-up, then the median of up to `reps` timed runs (at least 3, at most ~20 s), each
/// timed by the device's runtime (device events where it has them) over a batch of calls made
/// back to back (about 20 ms of device time, at most 50 calls), per call.
fn median_secs(reps: usize, device: Device, f: &dyn Fn() -> tefl_core::Result<()>) -> tefl_core::Result<f64> {
    let rt = tefl_core::device::runtime(device.kind)?;
    // Warm-up: calls back to back for at least WARM_UP_SECS, so that a GPU idle before the case
    // has raised its clocks. The H100 under Vulkan needed seconds of steady work: after 0.2 s,
    // and still after 1.5 s, it ran a 4096^3 GEMM about five times slower than after 3 s.
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < WARM_UP_SECS {
        f()?;
    }
    rt.synchronize(device)?;
    let one = rt.time_on_device(device, &mut || (0..4).try_for_each(|_| f()))? / 4.0;
    let batch = ((20e-3 / one.max(1e-7)).ceil() as usize).clamp(1, 50);
    let budget = Instant::now();
    let mut ts = Vec::new();
    while ts.len() < reps && (ts.len() < 3 || budget.elapsed().as_secs_f64() < 20.0) {
        let t = rt.time_on_device(device, &mut || (0..batch).try_for_each(|_| f()))?;
        ts.push(t / batch as f64);
    }
    ts.sort_by(f64::total_cmp);
    Ok(ts[ts.len() / 2])
}

/// Seconds of back-to-back calls before a case is timed.
const WARM_UP_SECS: f64 = 3.0;

const TORCH_SCRIPT: &str = r#"
import json, sys, time
import torch, torch.nn.functional as F
dev = sys.argv[1]
cases = json.loads(sys.stdin.read())
bf = torch.bfloat16
def t(*s, dt=bf): return (torch.rand(*s, device=dev, dtype=torch.float32) - 0.5).to(dt)
def sync():
    if dev.startswith("cuda"): torch.cuda.synchronize()
def bench(f, reps):
    f(); sync(); ts = []
    for _ in range(reps):
        a = time.perf_counter(); f(); sync(); ts.append(time.perf_counter() - a)
    ts.sort(); return ts[len(ts) // 2]
out = {}
for spec, reps in cases:
    w = spec.split(); op = w[0]; a = [int(x) for x in w[1:]]
    try:
        if op == "rmsnorm_fwd":
            x, g = t(a[0], a[1]), t(a[1]); f = lambda: F.rms_norm(x, (a[1],), g, 1e-5)
        elif op == "rmsnorm_bwd":
            x = t(a[0], a[1]).requires_grad_(); g = t(a[1]).requires_grad_(); y = F.rms_norm(x, (a[1],), g, 1e-5); dy = t(a[0], a[1])
            f = lambda: torch.autograd.grad(y, (x, g), dy, retain_graph=True)
        elif op == "layernorm_fwd":
            x, g = t(a[0], a[1]), t(a[1]); f = lambda: F.layer_norm(x, (a[1],), g, g, 1e-5)
        elif op == "gelu":
            x = t(a[0], a[1]); f = lambda: F.gelu(x, approximate="tanh")
        elif op == "swiglu":
            x = t(a[0], 2 * a[1]); f = lambda: (lambda u, v: F.silu(u) * v)(*x.chunk(2, -1))
        elif op == "softmax":
            x = t(a[0], a[1]); f = lambda: torch.softmax(x * 0.125, -1)
        elif op == "rope":
            s, b, h, d = a; x = t(s, b, h, d); fr = t(s, 1, 1, d, dt=torch.float32)
            c, sn = fr.cos().to(bf), fr.sin().to(bf)
            f = lambda: x * c + torch.cat((-x[..., d // 2:], x[..., : d // 2]), -1) * sn
        elif op == "gemm":
            m = a[0]; x = t(m, m); f = lambda: x @ x
        elif op == "gemm_f16":
            m = a[0]; x = t(m, m, dt=torch.float16); f = lambda: x @ x
        elif op in ("attn_fwd", "attn_bwd"):
            b, h, s, d = a; q = t(b, h, s, d).requires_grad_(op == "attn_bwd")
            from torch.nn.attention import sdpa_kernel, SDPBackend
            be = SDPBackend.FLASH_ATTENTION if dev.startswith("cuda") else SDPBackend.MATH
            with sdpa_kernel(be):
                if op == "attn_fwd":
                    f = lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True)
                else:
                    o = F.scaled_dot_product_attention(q, q, q, is_causal=True); do = t(b, h, s, d)
                    f = lambda: torch.autograd.grad(o, q, do, retain_graph=True)
                out[spec] = bench(f, reps); continue
        elif op == "adam":
            p = torch.nn.Parameter(t(a[0], dt=torch.float32)); p.grad = t(a[0], dt=torch.float32)
            opt = torch.optim.AdamW([p], lr=1e-4, fused=dev.startswith("cuda"))
            f = opt.step
        else:
            continue
        out[spec] = bench(f, reps)
    except Exception as e:
        out[spec] = None
        print(f"torch {spec}: {e}", file=sys.stderr)
print(json.dumps(out))
"#;

fn torch_times(
    device: &Device,
    specs: &[(String, usize)],
) -> Result<std::collections::HashMap<String, Option<f64>>, String> {
    use std::io::Write;
    let dev = if device.is_cpu() {
        "cpu".to_string()
    } else if device.kind.name() == "cuda" {
        format!("cuda:{}", device.ordinal)
    } else if device.kind.name() == "vulkan" {
        // A Vulkan device is compared with torch on the machine's CUDA device (on the GPU
        // machine, the same GPU).
        "cuda:0".to_string()
    } else {
        return Err(format!("torch has no equivalent of device {device}"));
    };
    let check = std::process::Command::new("python3").args(["-c", "import torch"]).output();
    if !check.is_ok_and(|o| o.status.success()) {
        return Err("python3 with torch is not available".into());
    }
    let mut child = std::process::Command::new("python3")
        .args(["-c", TORCH_SCRIPT, &dev])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let input = format!("[{}]", specs.iter().map(|(s, r)| format!("[\"{s}\", {r}]")).collect::<Vec<_>>().join(","));
    child.stdin.take().ok_or("no stdin")?.write_all(input.as_bytes()).map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value =
        serde_json::from_str(text.trim()).map_err(|e| format!("torch script output: {e}: {text}"))?;
    Ok(specs.iter().map(|(s, _)| (s.clone(), v.get(s).and_then(|x| x.as_f64()))).collect())
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut backend, mut shapes, mut vs_torch, mut json, mut reps) =
        ("reference".to_string(), None, false, None, 10usize);
    let mut only: Option<String> = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--backend" => backend = args.next().unwrap_or_default().to_ascii_lowercase(),
            "--shapes" => shapes = args.next(),
            "--vs" => vs_torch = args.next().as_deref() == Some("torch"),
            "--json" => json = args.next(),
            "--only" => only = args.next(),
            "--reps" => reps = args.next().and_then(|r| r.parse().ok()).unwrap_or(10),
            other => {
                eprintln!(
                    "bench: unexpected argument {other:?}\nusage: bench [--backend X] [--shapes anchor|small] [--vs torch] [--json FILE] [--reps N] [--only SUBSTRING]"
                );
                return ExitCode::from(2);
            }
        }
    }
    let _ = tefl_ops::linked_backends();
    let mgr: &'static Manager = Box::leak(Box::new(Manager::new(Registry::with_builtins(), Default::default())));
    let Some(info) = mgr.list_backends().into_iter().find(|b| b.name == backend) else {
        eprintln!("bench: backend '{backend}' is not in this build");
        return ExitCode::from(2);
    };
    if !info.available {
        eprintln!("bench: backend '{backend}' is unavailable here: {}", info.unavailable_reason.unwrap_or_default());
        return ExitCode::FAILURE;
    }
    let impl_of = |op: &str| {
        mgr.with_registry(|r| {
            r.impls_of(op)
                .iter()
                // The backend's own impl, not one kept for tests and selected only by id.
                .find(|i| i.backend_name().eq_ignore_ascii_case(&backend) && !i.is_by_name_only())
                .map(|i| (i.impl_id().to_string(), i.device_kind()))
        })
    };
    let Some((impl_id, kind)) = impl_of("generic_gemm").or_else(|| impl_of("rmsnorm_fwd")) else {
        eprintln!("bench: backend '{backend}' registers none of the benchmarked ops");
        return ExitCode::FAILURE;
    };
    let device = Device::new(kind, 0);
    let small = match shapes.as_deref() {
        Some("anchor") => false,
        Some("small") => true,
        None => device.is_cpu(),
        Some(other) => {
            eprintln!("bench: --shapes {other}: expected anchor or small");
            return ExitCode::from(2);
        }
    };
    let ctx = Ctx { mgr, impl_id: impl_id.clone(), device };
    println!(
        "bench: backend {backend} ({impl_id}) on {device}, {} shapes, median of up to {reps} runs of batched calls",
        if small { "small (CPU)" } else { "anchor" }
    );
    // Copy bandwidth in the same run (read + write), the memory-bound ops' yardstick.
    let copy_bytes = 256usize << 20;
    let copy_gbps = (|| -> tefl_core::Result<f64> {
        let rt = tefl_core::device::runtime(device.kind)?;
        let (src, dst) = (rt.alloc(device, copy_bytes)?, rt.alloc(device, copy_bytes)?);
        let t = median_secs(reps, device, &|| rt.copy_device_to_device(&*src, &*dst))?;
        Ok(2.0 * copy_bytes as f64 / t / 1e9)
    })()
    .map_err(|e| println!("copy: {e}"))
    .ok();
    match copy_gbps {
        Some(g) => println!("copy {} MiB: {g:.1} GB/s", copy_bytes >> 20),
        None => println!("copy: no figure, so no fraction of copy"),
    }
    let cases = match cases(&ctx, small) {
        Ok(c) => {
            c.into_iter().filter(|c| only.as_ref().is_none_or(|o| c.name.contains(o.as_str()))).collect::<Vec<_>>()
        }
        Err(e) => {
            eprintln!("bench: preparing inputs failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let torch = if vs_torch {
        match torch_times(&device, &cases.iter().map(|c| (c.torch.clone(), reps)).collect::<Vec<_>>()) {
            Ok(t) => Some(t),
            Err(e) => {
                println!("--vs torch: {e}; skipping the comparison");
                None
            }
        }
    } else {
        None
    };
    let mut rows = Vec::new();
    let mut failed = false;
    println!(
        "{:<40} {:>10} {:>12} {:>9} {:>10} {:>10}",
        "op", "median ms", "rate", "of copy", "torch ms", "tefl/torch"
    );
    for c in &cases {
        let t = match median_secs(reps, device, &*c.run) {
            Ok(t) => t,
            Err(e) => {
                println!("{:<40} error: {e}", c.name);
                failed = true;
                continue;
            }
        };
        let (rate, frac) = if c.flops > 0.0 {
            (format!("{:.2} TFLOP/s", c.flops / t / 1e12), String::new())
        } else {
            let g = c.bytes / t / 1e9;
            (format!("{g:.1} GB/s"), copy_gbps.map_or(String::new(), |cg| format!("{:.0}%", 100.0 * g / cg)))
        };
        let tt = torch.as_ref().and_then(|m| m.get(&c.torch).copied().flatten());
        let (tms, ratio) =
            tt.map_or((String::new(), String::new()), |x| (format!("{:.3}", x * 1e3), format!("{:.2}", t / x)));
        println!("{:<40} {:>10.3} {:>12} {:>9} {:>10} {:>10}", c.name, t * 1e3, rate, frac, tms, ratio);
        rows.push(serde_json::json!({
            "op": c.name, "median_ms": t * 1e3, "bytes": c.bytes, "flops": c.flops,
            "gbps": if c.bytes > 0.0 { Some(c.bytes / t / 1e9) } else { None },
            "tflops": if c.flops > 0.0 { Some(c.flops / t / 1e12) } else { None },
            "copy_gbps": copy_gbps, "torch_ms": tt.map(|x| x * 1e3), "tefl_over_torch": tt.map(|x| t / x),
        }));
    }
    if let Some(path) = json {
        let doc = serde_json::json!({ "backend": backend, "impl_id": impl_id, "device": device.to_string(), "shapes": if small { "small" } else { "anchor" }, "results": rows });
        let mut s = String::new();
        let _ = write!(s, "{doc:#}");
        if let Err(e) = std::fs::write(&path, s) {
            eprintln!("bench: writing {path}: {e}");
            return ExitCode::FAILURE;
        }
        println!("wrote {path}");
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
