//! `bench [--backend X] [--shapes anchor|small] [--vs torch] [--json FILE] [--svg FILE] [--reps N]
//! [--rounds N] [--only SUBSTRING[,...]] [--attn-d 64|128|256] [--gemm MxNxK[,...]] [--deadline SECS]`
//! (or `bench --tables A.json[,B.json...] [--json FILE] [--svg FILE]`): times each op of the anchor table
//! (`shared/device/README.md`) on the backend's device, and with `--vs torch` every peer a
//! PyTorch user can pick on the same shapes in the same run (`tests/src/bench_peers.py`: torch
//! eager, torch.compile for norms, activations, softmax and RoPE, SDPA's flash and cuDNN
//! backends for attention, FlagGems when it is importable). Each case's peers are timed right
//! after tefl's, by one Python process that serves the whole run (`Peers`); the table comes
//! once every case is measured.
//!
//! tefl and its peers are timed the same way, on inputs drawn alike (uniform in [-0.5, 0.5)):
//! one call (where kernels compile) and a wait, then 3 s (`TEFL_BENCH_WARMUP`) of back-to-back
//! calls as warm-up (a GPU idle before a case raises
//! its clocks, and a power-bound one lowers them as it heats), then per repetition an L2 flush
//! (a 256 MiB fill: the runtime's `flush_cache` on tefl's side, on CUDA the driver's memset;
//! torch's `zero_()` on the peers' unless `TEFL_BENCH_PEER_FLUSH=memset` gives them that
//! memset; on CUDA, on both sides, after an L2 scrub that puts lines held at the evict_last
//! priority back to normal, which a fill alone leaves in L2: tefl-kernels' cuda/l2_scrub.cu)
//! followed, with no host wait, by one call timed on the device (CUDA events; Vulkan timestamp
//! queries), every repetition queued before one wait for them all where the
//! runtime can (CUDA, as the peers' loop does), and the median of the repetitions. Reports GB/s
//! (each input read once, each output written once) or TFLOP/s, the fraction of a copy's bandwidth
//! measured the same way, each peer's time, the best peer and tefl's speed relative to it
//! (best peer's time / tefl's: above 1, tefl is faster). `--svg FILE` draws that last column
//! as a bar chart. `cargo xtask bench` runs it. `TEFL_BENCH_HOST=1` also prints each case's
//! median host time per call: where it passes the flush's device time, the device waits for
//! the host inside the timed span. `--attn-d` sets the attention cases' head dim (128, the
//! anchor's, unless given). The attention cases also run on the same sequences packed as thd
//! (`attn_fwd thd` / `attn_bwd thd`, cumulative lengths and TE's max_seqlen bounds, so that
//! the lengths are not read on the host), their peers SDPA's on the batch. `--gemm` adds bf16
//! GEMMs of other shapes (`gemm MxNxK`: A m×k, B k×n, both row-major; torch's `A @ B` as peer),
//! for the shapes a tile choice or a small-product path should be judged on. `--rounds N` (1 to
//! 10, default 1) times each case N times in turns, tefl then its peers, and keeps each side's
//! fastest round: a state of the card that slows one round (a power cap reached by the case
//! before, another process's context) then weighs on neither side's figure; the JSON keeps
//! every round, and the table names the spread of tefl's rounds.
//!
//! `--deadline SECS` starts no case once SECS have passed since the start (the first case always
//! runs): a run under a command's time limit (the GPU machine's 10 minutes) ends with the table
//! of what it measured and names the rest, with the `--only` that runs them (the JSON's
//! `not_measured`). `--tables A.json,B.json` measures nothing: it prints the results of such
//! runs' `--json` files as one table (and `--json` / `--svg` of it), each op with the peers it was
//! timed with in its own run; files of different backends, devices or shapes, or with an op
//! twice, are refused.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use tefl_core::catalogue::*;
use tefl_core::device::{Buffer, DeviceRuntime};
use tefl_core::{DType, Device, Manager, Op, Registry, Tensor};
use tefl_tests::chart::{Bar, svg};
use tefl_tests::cli;
use tefl_tests::progress::Progress;

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
    /// `--only a,b`: the parts of the case names kept (all cases when `None`).
    only: Option<Vec<String>>,
    /// Tensors declared so far (each gets its own random stream).
    tensors: std::cell::Cell<u64>,
}

/// An input tensor made on first use: cases share inputs, and a run filtered by `--only`
/// makes (draws, converts and uploads) only those of the cases it keeps. Its random stream is
/// fixed when it is declared, so its values do not depend on the filter.
struct Input<'c> {
    ctx: &'c Ctx,
    shape: Vec<usize>,
    dtype: DType,
    seed: u64,
    made: std::cell::OnceCell<Tensor>,
}

impl Input<'_> {
    /// The tensor (made now if no case has asked for it yet).
    fn get(&self) -> tefl_core::Result<Tensor> {
        if let Some(t) = self.made.get() {
            return Ok(t.clone());
        }
        // Drawn as f32 on the host first: a shape (from --gemm) too large for the host's memory
        // is an error naming it, not an abort.
        let elems = self.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let mut v: Vec<f32> = Vec::new();
        let Some(n) = elems.filter(|&n| v.try_reserve_exact(n).is_ok()) else {
            return Err(tefl_core::Error::OutOfMemory {
                device: "host".into(),
                bytes: elems.and_then(|n| n.checked_mul(4)).unwrap_or(usize::MAX),
                what: format!("the bench's {:?} input of shape {:?}, drawn as f32", self.dtype, self.shape),
            });
        };
        let mut rng = tefl_tests::Rng::new(0x7E_F1_BE_4C + self.seed);
        v.extend((0..n).map(|_| rng.uniform(-0.5, 0.5) as f32));
        let t = Tensor::from_slice(&v, &self.shape, self.dtype)?.to_device(&self.ctx.device)?;
        Ok(self.made.get_or_init(|| t).clone())
    }
}

impl Ctx {
    /// A tensor of uniform values in [-0.5, 0.5), the distribution the peers' script draws
    /// (`torch.rand(..) - 0.5`): a GEMM's power draw, hence its clocks, depends on its data, so
    /// tefl and its peers are fed alike. Made when a kept case first asks for it.
    fn t(&self, shape: &[usize], dtype: DType) -> Input<'_> {
        let seed = self.tensors.get();
        self.tensors.set(seed + 1);
        Input { ctx: self, shape: shape.to_vec(), dtype, seed, made: std::cell::OnceCell::new() }
    }
    /// Whether `--only` keeps the case `name` (its name contains one of the parts).
    fn keeps(&self, name: &str) -> bool {
        self.only.as_ref().is_none_or(|o| o.iter().any(|part| name.contains(part.as_str())))
    }
    /// The case `name` when `--only` keeps it, its arguments made by `args` (only then).
    fn case<O: Op>(
        &self,
        name: String,
        torch: String,
        bytes: f64,
        flops: f64,
        args: impl FnOnce() -> tefl_core::Result<O::Args>,
    ) -> tefl_core::Result<Option<Case>>
    where
        O::Args: 'static,
    {
        if !self.keeps(&name) {
            return Ok(None);
        }
        let (mgr, id, args) = (self.mgr, self.impl_id.clone(), args()?);
        Ok(Some(Case { name, torch, bytes, flops, run: Box::new(move || mgr.call_impl::<O>(&id, &args).map(|_| ())) }))
    }
}

/// `--gemm`'s value: shapes `MxNxK`, comma-separated, each dimension at least 1.
fn parse_gemm_shapes(v: &str) -> Result<Vec<(usize, usize, usize)>, String> {
    v.split(',')
        .map(|s| {
            let dims: Vec<Option<usize>> =
                s.trim().split(['x', 'X']).map(|d| d.trim().parse::<usize>().ok().filter(|&d| d > 0)).collect();
            match dims[..] {
                [Some(m), Some(n), Some(k)] => Ok((m, n, k)),
                _ => Err(format!("--gemm {s:?}: expected MxNxK with positive integers, e.g. 1024x4096x4096")),
            }
        })
        .collect()
}

fn cases(c: &Ctx, small: bool, attn_d: usize, extra_gemms: &[(usize, usize, usize)]) -> tefl_core::Result<Vec<Case>> {
    let bf = DType::BF16;
    let (r, n) = if small { (4096, 4096) } else { (16384, 8192) };
    let mut v = Vec::new();
    let (x, g) = (c.t(&[r, n], bf), c.t(&[n], bf));
    let e = 2.0;
    let rn = (r * n) as f64;
    // The rmsnorm forward cases' arguments: x and gamma, the FP8 quantizer's scale and the
    // output dtype.
    let rms = |x: &Input, g: &Input, scale: Option<Tensor>, out_dtype| -> tefl_core::Result<RmsNormFwdArgs> {
        Ok(RmsNormFwdArgs { scale, x: x.get()?, gamma: g.get()?, eps: 1e-5, zero_centered_gamma: false, out_dtype })
    };
    v.extend(c.case::<RmsNormFwd>(
        format!("rmsnorm_fwd {r}x{n}"),
        format!("rmsnorm_fwd {r} {n}"),
        e * 2.0 * rn,
        0.0,
        || rms(&x, &g, None, bf),
    )?);
    if !small {
        let (x2, g2) = (c.t(&[8192, 4096], bf), c.t(&[4096], bf));
        v.extend(c.case::<RmsNormFwd>(
            "rmsnorm_fwd 8192x4096".into(),
            "rmsnorm_fwd 8192 4096".into(),
            e * 2.0 * 8192.0 * 4096.0,
            0.0,
            || rms(&x2, &g2, None, bf),
        )?);
    }
    // TE's norm with an FP8 output quantizer (bytes: read x, write FP8). `one`: the unit scale
    // of the FP8 cases (`c.t` fills with a pattern, not ones).
    let one = Tensor::from_slice(&[1.0f32], [1], DType::F32)?.to_device(&c.device)?;
    v.extend(c.case::<RmsNormFwd>(
        format!("rmsnorm_fwd fp8 {r}x{n}"),
        format!("rmsnorm_fp8 {r} {n}"),
        3.0 * rn,
        0.0,
        || rms(&x, &g, Some(one.clone()), DType::F8E4M3),
    )?);
    let (rs, dy) = (c.t(&[r], DType::F32), c.t(&[r, n], bf));
    v.extend(c.case::<RmsNormBwd>(
        format!("rmsnorm_bwd {r}x{n}"),
        format!("rmsnorm_bwd {r} {n}"),
        e * 3.0 * rn,
        0.0,
        // dy a tensor of its own: the same buffer as x would be read once from memory and
        // once from L2.
        || {
            Ok(RmsNormBwdArgs {
                dy: dy.get()?,
                x: x.get()?,
                rsigma: rs.get()?,
                gamma: g.get()?,
                zero_centered_gamma: false,
            })
        },
    )?);
    v.extend(c.case::<LayerNormFwd>(
        format!("layernorm_fwd {r}x{n}"),
        format!("layernorm_fwd {r} {n}"),
        e * 2.0 * rn,
        0.0,
        || {
            Ok(LayerNormFwdArgs {
                scale: None,
                x: x.get()?,
                gamma: g.get()?,
                beta: g.get()?,
                eps: 1e-5,
                zero_centered_gamma: false,
                out_dtype: bf,
            })
        },
    )?);
    // The LayerNorm backward (bytes: read x and dy, write dx), its mu a tensor of its own.
    let mu = c.t(&[r], DType::F32);
    v.extend(c.case::<LayerNormBwd>(
        format!("layernorm_bwd {r}x{n}"),
        format!("layernorm_bwd {r} {n}"),
        e * 3.0 * rn,
        0.0,
        || {
            Ok(LayerNormBwdArgs {
                dy: dy.get()?,
                x: x.get()?,
                mu: mu.get()?,
                rsigma: rs.get()?,
                gamma: g.get()?,
                zero_centered_gamma: false,
            })
        },
    )?);
    v.extend(c.case::<Gelu>(format!("gelu {r}x{n}"), format!("gelu {r} {n}"), e * 2.0 * rn, 0.0, || {
        Ok(ActArgs { x: x.get()? })
    })?);
    let x2n = c.t(&[r, 2 * n], bf);
    v.extend(c.case::<Swiglu>(format!("swiglu {r}x{n}"), format!("swiglu {r} {n}"), e * 3.0 * rn, 0.0, || {
        Ok(ActArgs { x: x2n.get()? })
    })?);
    v.extend(c.case::<ScaledSoftmaxForward>(
        format!("softmax {r}x{n}"),
        format!("softmax {r} {n}"),
        e * 2.0 * rn,
        0.0,
        || Ok(SoftmaxArgs { x: x.get()?.reshape([1, 1, r, n])?, scale: 0.125 }),
    )?);
    let sdy = c.t(&[1, 1, r, n], bf);
    v.extend(c.case::<ScaledSoftmaxBackward>(
        format!("softmax_bwd {r}x{n}"),
        format!("softmax_bwd {r} {n}"),
        e * 3.0 * rn,
        0.0,
        || Ok(SoftmaxBwdArgs { dy: sdy.get()?, y: x.get()?.reshape([1, 1, r, n])?, scale: 0.125 }),
    )?);
    let (s, b, h, d) = if small { (1024, 2, 8, 128) } else { (4096, 4, 32, 128) };
    let (xr, fr) = (c.t(&[s, b, h, d], bf), c.t(&[s, d], DType::F32));
    v.extend(c.case::<FusedRopeForward>(
        format!("rope_fwd s{s} b{b} h{h} d{d}"),
        format!("rope {s} {b} {h} {d}"),
        e * 2.0 * (s * b * h * d) as f64 + 4.0 * (s * d) as f64,
        0.0,
        || {
            Ok(RopeArgs {
                x: xr.get()?,
                freqs: fr.get()?,
                cu_seqlens: None,
                start_positions: None,
                layout: QkvLayout::Sbhd,
                interleaved: false,
            })
        },
    )?);
    // TE's cast to FP8 (e4m3, unit scale) with its amax, then with the transpose of the codes
    // too (bytes: read x, write the codes, and their transpose).
    for (transpose, name, bytes) in [(false, "quantize", 3.0), (true, "quantize_t", 4.0)] {
        v.extend(c.case::<Quantize>(format!("{name} {r}x{n}"), format!("{name} {r} {n}"), bytes * rn, 0.0, || {
            Ok(QuantizeArgs { x: x.get()?, scale: one.clone(), fp8_dtype: DType::F8E4M3, want_transpose: transpose })
        })?);
    }
    let sizes: &[usize] = if small { &[1024, 2048] } else { &[4096, 8192] };
    // bf16 at each size, and f16 at the first (backends whose fast paths differ by dtype: Vulkan's
    // cooperative matrices need VK_KHR_shader_bfloat16 for bf16).
    let gemms = sizes.iter().map(|&m| (m, bf, "")).chain([(sizes[0], DType::F16, " f16")]);
    for (m, dt, tag) in gemms {
        let a = c.t(&[m, m], dt);
        v.extend(c.case::<GenericGemm>(
            format!("gemm{tag} {m}^3"),
            format!("gemm{} {m}", tag.replace(' ', "_")),
            0.0,
            2.0 * (m as f64).powi(3),
            // A 16-bit product's output dtype is its inputs' (GemmArgs::new).
            || {
                let a = a.get()?;
                Ok(GemmArgs::new(a.clone(), a))
            },
        )?);
    }
    for &(m, n, k) in extra_gemms {
        let (a, b) = (c.t(&[m, k], bf), c.t(&[k, n], bf));
        v.extend(c.case::<GenericGemm>(
            format!("gemm {m}x{n}x{k}"),
            format!("gemm_mnk {m} {n} {k}"),
            0.0,
            2.0 * m as f64 * n as f64 * k as f64,
            || Ok(GemmArgs::new(a.get()?, b.get()?)),
        )?);
    }
    // FP8 (e4m3, TN, bf16 D, fast accumulation: TE's forward GEMM) against torch._scaled_mm.
    for &m in sizes {
        let a = c.t(&[m, m], DType::F8E4M3);
        v.extend(c.case::<GenericGemm>(
            format!("gemm fp8 {m}^3"),
            format!("gemm_fp8 {m}"),
            0.0,
            2.0 * (m as f64).powi(3),
            || {
                let a = a.get()?;
                Ok(GemmArgs {
                    a_scale_inv: Some(one.clone()),
                    b_scale_inv: Some(one.clone()),
                    transb: true,
                    ..GemmArgs::new(a.clone(), a)
                })
            },
        )?);
    }
    // Grouped GEMM: 8 experts, uneven m summing to 16384 (4 in small runs), k = n = 4096.
    let (total, kn) = if small { (2048, 1024) } else { (16384, 4096) };
    let ms: Vec<usize> = [3, 1, 2, 2, 1, 3, 2, 2].iter().map(|w| w * total / 16).collect();
    let splits: Vec<String> = ms.iter().map(|m| m.to_string()).collect();
    // bf16, then the same experts in FP8 (e4m3 TN, bf16 D, fast accumulation: TE's forward)
    // against per-expert torch._scaled_mm.
    for (label, op, dtype) in [("", "grouped_gemm", bf), (" fp8", "grouped_gemm_fp8", DType::F8E4M3)] {
        let xs: Vec<Input<'_>> = ms.iter().map(|&m| c.t(&[m, kn], dtype)).collect();
        let ws: Vec<Input<'_>> = ms.iter().map(|_| c.t(&[kn, kn], dtype)).collect();
        let scales = if dtype.is_fp8() { vec![one.clone(); ms.len()] } else { Vec::new() };
        v.extend(c.case::<GroupedGemm>(
            format!("grouped_gemm{label} 8x {total}x{kn}x{kn}"),
            format!("{op} {kn} {}", splits.join(" ")),
            0.0,
            2.0 * (total * kn * kn) as f64,
            || {
                Ok(GroupedGemmArgs {
                    a: xs.iter().map(Input::get).collect::<tefl_core::Result<_>>()?,
                    b: ws.iter().map(Input::get).collect::<tefl_core::Result<_>>()?,
                    a_scale_inv: scales.clone(),
                    b_scale_inv: scales,
                    bias: Vec::new(),
                    transa: false,
                    transb: true,
                    out_dtype: bf,
                    split_accumulator: false,
                })
            },
        )?);
    }
    let (ab, ah, asq, ad) = if small { (1, 8, 1024, attn_d) } else { (4, 32, 4096, attn_d) };
    // q, k, v and dO of their own, as the peers' (bench_peers.py's `attention`): with one tensor
    // for all three, autograd sums the peers' three gradients into one, work tefl's call
    // (three gradients) does not do.
    let qkv = [(); 3].map(|()| c.t(&[ab, asq, ah, ad], bf));
    let d_o = c.t(&[ab, asq, ah, ad], bf);
    let fwd_flops = 4.0 * (ab * ah) as f64 * (asq as f64).powi(2) * ad as f64 / 2.0;
    let fwd = || -> tefl_core::Result<AttnFwdArgs> {
        Ok(AttnFwdArgs {
            q: qkv[0].get()?,
            k: qkv[1].get()?,
            v: qkv[2].get()?,
            cu_seqlens_q: None,
            cu_seqlens_kv: None,
            layout: QkvLayout::Bshd,
            mask: AttnMask::Causal,
            scale: 1.0 / (ad as f32).sqrt(),
            dropout_p: 0.0,
            seed: 0,
            offset: 0,
            window: AttnWindow::default(),
            max_seqlen_q: None,
            max_seqlen_kv: None,
        })
    };
    v.extend(c.case::<FusedAttnFwd>(
        format!("attn_fwd causal b{ab} h{ah} s{asq} d{ad}"),
        format!("attn_fwd {ab} {ah} {asq} {ad}"),
        0.0,
        fwd_flops,
        fwd,
    )?);
    // The backward's inputs come from a forward call; a backend without attention has no case.
    let bwd_name = format!("attn_bwd causal b{ab} h{ah} s{asq} d{ad}");
    let det_name = format!("attn_bwd deterministic causal b{ab} h{ah} s{asq} d{ad}");
    if c.keeps(&bwd_name) || c.keeps(&det_name) {
        let args = fwd()?;
        if let Ok(o) = c.mgr.call_impl::<FusedAttnFwd>(&c.impl_id, &args) {
            v.extend(c.case::<FusedAttnBwd>(
                bwd_name,
                format!("attn_bwd {ab} {ah} {asq} {ad}"),
                0.0,
                2.5 * fwd_flops,
                || Ok(args.backward(o.o.clone(), d_o.get()?, o.softmax_lse.clone())),
            )?);
            // The same call asking for a deterministic dQ. No peer: SDPA has no such switch.
            v.extend(c.case::<FusedAttnBwd>(
                det_name,
                format!("attn_bwd_deterministic {ab} {ah} {asq} {ad}"),
                0.0,
                2.5 * fwd_flops,
                || Ok(AttnBwdArgs { deterministic: true, ..args.backward(o.o, d_o.get()?, o.softmax_lse) }),
            )?);
        }
    }
    // The same sequences packed as thd (q, k, v [b s, h, d] with cumulative lengths): the peers'
    // times are SDPA's on the batch (the same work).
    let thd_fwd = || -> tefl_core::Result<AttnFwdArgs> {
        let packed = |i: usize| qkv[i].get()?.reshape([ab * asq, ah, ad]);
        let cu: Vec<i32> = (0..=ab).map(|i| (i * asq) as i32).collect();
        let cu = Tensor::from_slice(&cu, [ab + 1], DType::I32)?.to_device(&c.device)?;
        Ok(AttnFwdArgs {
            q: packed(0)?,
            k: packed(1)?,
            v: packed(2)?,
            cu_seqlens_q: Some(cu.clone()),
            cu_seqlens_kv: Some(cu),
            layout: QkvLayout::Thd,
            mask: AttnMask::PaddingCausal,
            // TE's callers give the bounds: the lengths stay on the device.
            max_seqlen_q: Some(asq),
            max_seqlen_kv: Some(asq),
            ..fwd()?
        })
    };
    v.extend(c.case::<FusedAttnFwd>(
        format!("attn_fwd thd causal {ab}x{asq} h{ah} d{ad}"),
        format!("attn_fwd {ab} {ah} {asq} {ad}"),
        0.0,
        fwd_flops,
        thd_fwd,
    )?);
    let thd_bwd = format!("attn_bwd thd causal {ab}x{asq} h{ah} d{ad}");
    if c.keeps(&thd_bwd) {
        let args = thd_fwd()?;
        if let Ok(o) = c.mgr.call_impl::<FusedAttnFwd>(&c.impl_id, &args) {
            let d_o = d_o.get()?.reshape([ab * asq, ah, ad])?;
            v.extend(c.case::<FusedAttnBwd>(
                thd_bwd,
                format!("attn_bwd {ab} {ah} {asq} {ad}"),
                0.0,
                2.5 * fwd_flops,
                || Ok(args.backward(o.o, d_o, o.softmax_lse)),
            )?);
        }
    }
    let np = if small { 16 << 20 } else { 256 << 20 };
    let (p, gr, m, vv) =
        (c.t(&[np], DType::F32), c.t(&[np], DType::F32), c.t(&[np], DType::F32), c.t(&[np], DType::F32));
    v.extend(c.case::<MultiTensorAdam>(
        format!("adam {}M f32 params", np >> 20),
        format!("adam {np}"),
        7.0 * 4.0 * np as f64,
        0.0,
        || {
            Ok(MultiTensorAdamArgs {
                noop_flag: Tensor::from_slice(&[0i32], [1], DType::I32)?.to_device(&c.device)?,
                grads: vec![gr.get()?],
                params: vec![p.get()?],
                exp_avg: vec![m.get()?],
                exp_avg_sq: vec![vv.get()?],
                hyper: AdamHyper::adamw(1e-4),
            })
        },
    )?);
    Ok(v)
}

/// How bench times one case on a device: warm-up, then per repetition an L2 flush and one
/// call timed right after it on the device.
struct Timer {
    rt: std::sync::Arc<dyn DeviceRuntime>,
    device: Device,
    /// What each repetition flushes the cache with first (GPU devices, `flush_cache`): larger
    /// than any last-level cache here.
    flush: Option<std::sync::Arc<dyn Buffer>>,
    /// Seconds of back-to-back calls before each case is timed.
    warm_up: f64,
}

/// Seconds of back-to-back calls before a case is timed: 3, or `TEFL_BENCH_WARMUP` (seconds,
/// 0.1 to 60; the peers' script reads it too), e.g. to fit a full CUDA run with every peer in
/// a time limit. A value that is not such a number is an error naming it.
fn checked_warm_up_secs() -> Result<f64, String> {
    match std::env::var("TEFL_BENCH_WARMUP") {
        Err(std::env::VarError::NotPresent) => Ok(3.0),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!("TEFL_BENCH_WARMUP={v:?}: not UTF-8")),
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| (0.1..=60.0).contains(s))
            .ok_or_else(|| format!("TEFL_BENCH_WARMUP={v:?}: expected seconds from 0.1 to 60")),
    }
}

/// How the peers' process flushes the L2 before each timed call, from `TEFL_BENCH_PEER_FLUSH`:
/// `zero` (torch's `zero_()`, a fill kernel; the default) or `memset` (the CUDA driver's
/// `cuMemsetD8Async`, the fill of tefl's side on CUDA: `Timer`'s `flush_cache`). Another
/// value is an error naming it. The peers' script reads the variable itself; this checks it
/// before any case runs and names the choice in the run's first line.
fn checked_peer_flush() -> Result<&'static str, String> {
    match std::env::var("TEFL_BENCH_PEER_FLUSH") {
        Err(std::env::VarError::NotPresent) => Ok("zero"),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!("TEFL_BENCH_PEER_FLUSH={v:?}: not UTF-8")),
        Ok(v) => match v.as_str() {
            "zero" => Ok("zero"),
            "memset" => Ok("memset"),
            _ => Err(format!("TEFL_BENCH_PEER_FLUSH={v:?}: expected zero or memset")),
        },
    }
}

/// Bytes of the L2 flush (H100: 50 MB of L2, H200: 60 MB).
const FLUSH_BYTES: usize = 256 << 20;

impl Timer {
    fn new(device: Device, warm_up: f64) -> tefl_core::Result<Self> {
        let rt = tefl_core::device::runtime(device.kind)?;
        let flush = if device.is_cpu() { None } else { Some(rt.alloc(device, FLUSH_BYTES)?) };
        if let Some(buf) = &flush {
            // Once before any case: where the flush compiles a kernel (CUDA's L2 scrub), it
            // does so here, and an error in it ends the run before the first case.
            rt.flush_cache(&**buf)?;
            rt.synchronize(device)?;
        }
        Ok(Timer { rt, device, flush, warm_up })
    }

    /// Warm-up, then the median of `reps` timed calls (at least 3; without a flush, on the host's
    /// clock, at most ~20 s of them).
    fn median_secs(&self, reps: usize, f: &dyn Fn() -> tefl_core::Result<()>) -> tefl_core::Result<f64> {
        // Warm-up: calls back to back for at least the warm-up time, so that a GPU idle before the
        // case has raised its clocks. The H100 under Vulkan needed seconds of steady work:
        // after 0.2 s, and still after 1.5 s, it ran a 4096^3 GEMM about five times slower
        // than after 3 s (the slow phase ends at once, not gradually).
        // The first call stands outside the warm-up's clock, as in the peers' loop: with a cold
        // kernel cache it compiles (NVRTC: up to seconds), and a warm-up spent compiling left
        // the GPU idle and its clocks down when the timed calls began (H200, 2026-12-03, a
        // fresh cache, bench --vs torch --rounds 2: gelu's first round 0.144 ms, its second
        // 0.130).
        f()?;
        self.rt.synchronize(self.device)?;
        let warm = Instant::now();
        while warm.elapsed().as_secs_f64() < self.warm_up {
            f()?;
        }
        self.rt.synchronize(self.device)?;
        let mut ts = Vec::new();
        let mut host = Vec::new();
        {
            let mut timed = || {
                let t0 = Instant::now();
                let r = f();
                host.push(t0.elapsed().as_secs_f64());
                r
            };
            match &self.flush {
                // Flush, call, flush, call, ... all queued, then one wait (as the peers' loop does).
                Some(buf) => {
                    ts = self.rt.time_reps_after(
                        self.device,
                        reps.max(3),
                        &mut || self.rt.flush_cache(&**buf),
                        &mut timed,
                    )?;
                }
                None => {
                    let budget = Instant::now();
                    while ts.len() < reps.max(3) && (ts.len() < 3 || budget.elapsed().as_secs_f64() < 20.0) {
                        ts.push(self.rt.time_on_device(self.device, &mut timed)?);
                    }
                }
            }
        }
        if std::env::var_os("TEFL_BENCH_HOST").is_some() {
            host.sort_by(f64::total_cmp);
            eprintln!("  host time per call: median {:.1} us", host[host.len() / 2] * 1e6);
        }
        ts.sort_by(f64::total_cmp);
        Ok(ts[ts.len() / 2])
    }
}

/// One case's measurements over its rounds (`--rounds`).
struct Rounds {
    /// tefl's fastest round, or the error that ended its rounds.
    best: tefl_core::Result<f64>,
    /// tefl's median of each round that ran.
    each: Vec<f64>,
    /// Each peer's fastest round (None where it failed in every round); None without peers or
    /// after an error on tefl's side.
    peers: Option<PeerTimes>,
    /// Each round's peer times.
    peers_each: Vec<PeerTimes>,
}

impl Rounds {
    fn of(mine: Vec<tefl_core::Result<f64>>, peers_each: Vec<PeerTimes>, with_peers: bool) -> Self {
        let mut each = Vec::new();
        let mut best: tefl_core::Result<f64> = Ok(f64::INFINITY);
        for t in mine {
            match t {
                Ok(t) => {
                    each.push(t);
                    if let Ok(b) = &mut best {
                        *b = b.min(t);
                    }
                }
                Err(e) => best = Err(e),
            }
        }
        let peers = (with_peers && best.is_ok()).then(|| {
            let mut merged = PeerTimes::new();
            for round in &peers_each {
                for (peer, t) in round {
                    let slot = merged.entry(peer.clone()).or_insert(None);
                    if let Some(t) = *t {
                        *slot = Some(slot.map_or(t, |s: f64| s.min(t)));
                    }
                }
            }
            merged
        });
        Rounds { best, each, peers, peers_each }
    }
}

/// The peers' side (python3 with torch), run as a child process.
const PEERS_SCRIPT: &str = include_str!("../bench_peers.py");

/// Seconds per peer of one spec (None: the peer failed on it).
type PeerTimes = std::collections::BTreeMap<String, Option<f64>>;

/// The peers' Python process: it takes one spec at a time on stdin and answers with the spec,
/// a line per peer and a done line.
struct PeerProcess {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

/// The peers of `--vs torch`, measured case by case right after tefl's timing of the same case,
/// so that both sides meet the card in the same state (timed as two blocks, peers first, the
/// first memory-bound cases of tefl's block ran 9% slower on the H200 than in a run of their
/// own). One Python process serves the run (torch, FlagGems and torch.compile's workers start
/// once); a peer that faults the device takes it down, that spec's later peers are missing
/// from the table, and the next spec starts a new one.
struct Peers {
    dev: String,
    /// The peers' script, written to a file of the run's own: Triton compiles only kernels
    /// whose source it can read from a file (the script's L2 scrub is one), not from `-c`.
    script: std::path::PathBuf,
    process: Option<PeerProcess>,
    /// Specs measured so far, by spec and round (cases sharing a spec, like the thd attention
    /// cases and the bshd ones, are measured once a round).
    done: std::collections::HashMap<(String, usize), PeerTimes>,
    /// Time spent waiting for the peers.
    spent: std::time::Duration,
}

impl Peers {
    fn new(device: &Device) -> Result<Self, String> {
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
        // A folder of its own: Python puts the script's folder first on its import path.
        let dir = std::env::temp_dir().join(format!("tefl-bench-peers-{}", std::process::id()));
        let script = dir.join("bench_peers.py");
        std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&script, PEERS_SCRIPT)).map_err(|e| {
            // The folder goes with the failure (Peers' drop removes it otherwise).
            let _ = std::fs::remove_dir_all(&dir);
            format!("writing {}: {e}", script.display())
        })?;
        Ok(Peers { dev, script, process: None, done: Default::default(), spent: Default::default() })
    }

    fn spawn(&self) -> Result<PeerProcess, String> {
        use std::io::BufRead;
        let mut child = std::process::Command::new("python3")
            .arg(&self.script)
            .arg(&self.dev)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        Ok(PeerProcess { child, stdin, lines: std::io::BufReader::new(stdout).lines() })
    }

    /// Every peer's time for `spec` in round `round` (what the process measured before it ended,
    /// if it did).
    fn measure(&mut self, spec: &str, reps: usize, round: usize) -> PeerTimes {
        if let Some(t) = self.done.get(&(spec.to_string(), round)) {
            return t.clone();
        }
        eprintln!("bench peers: {spec} (peers so far: {:.0} s)", self.spent.as_secs_f64());
        let started = std::time::Instant::now();
        let times = self.measure_in_process(spec, reps);
        self.spent += started.elapsed();
        self.done.insert((spec.to_string(), round), times.clone());
        times
    }

    /// One spec through the running process (started if there is none).
    fn measure_in_process(&mut self, spec: &str, reps: usize) -> PeerTimes {
        use std::io::Write;
        let mut times = PeerTimes::new();
        let mut process = match self.process.take().map_or_else(|| self.spawn(), Ok) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("bench peers: starting python3: {e}");
                return times;
            }
        };
        let line = serde_json::json!([spec, reps]).to_string() + "\n";
        let mut finished = false;
        if process.stdin.write_all(line.as_bytes()).and_then(|()| process.stdin.flush()).is_ok() {
            for line in process.lines.by_ref() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<serde_json::Value>(&line) {
                    Ok(serde_json::Value::Array(v)) => {
                        if let [serde_json::Value::String(s), serde_json::Value::String(peer), secs] = v.as_slice()
                            && s == spec
                        {
                            times.insert(peer.clone(), secs.as_f64());
                        }
                    }
                    Ok(serde_json::Value::Object(o)) if o.get("done").and_then(|d| d.as_str()) == Some(spec) => {
                        finished = true;
                        break;
                    }
                    _ => {}
                }
            }
        }
        if finished {
            self.process = Some(process);
        } else {
            drop(process.stdin);
            match process.child.wait() {
                Ok(status) => {
                    eprintln!("bench peers: the process ended with {status} on '{spec}'; kept what it measured")
                }
                Err(e) => eprintln!("bench peers: the process ended on '{spec}' ({e}); kept what it measured"),
            }
        }
        times
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        // Closing its stdin ends the process's loop.
        if let Some(p) = self.process.take() {
            drop(p.stdin);
            let mut child = p.child;
            let _ = child.wait();
        }
        if let Some(dir) = self.script.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

const USAGE: &str = "usage: bench [--backend X] [--shapes anchor|small] [--vs torch] [--json FILE] [--svg FILE] \
[--reps N] [--rounds N] [--only SUBSTRING[,SUBSTRING...]] [--attn-d 64|128|256] [--gemm MxNxK[,MxNxK...]] \
[--deadline SECS]
       bench --tables A.json[,B.json...] [--json FILE] [--svg FILE]

Times each op of the anchor table on the backend's device (reference, the CPU, unless
--backend names another; small shapes on the CPU, the anchor shapes elsewhere, unless --shapes
says), and with --vs torch every peer a PyTorch user can pick (torch eager, torch.compile,
SDPA flash / cuDNN, FlagGems) in the same run. --reps N calls a case (median; 20), --rounds N
times it in turns with its peers, keeping each side's fastest round (1 to 10; 1), --only runs
the cases whose name contains a part, --json and --svg write the table and its chart,
--deadline SECS starts no case after SECS seconds (the first always runs) and names the rest.
--tables prints earlier runs' --json files as one table, measuring nothing.
TEFL_BENCH_WARMUP sets the warm-up seconds a case (3); TEFL_BENCH_PEER_FLUSH=memset flushes the
peers' L2 with the driver's memset, as tefl's side is (zero: torch's zero_(), the default).";

/// The parsed command line.
struct Args {
    backend: String,
    shapes: Option<String>,
    vs_torch: bool,
    json: Option<String>,
    svg_path: Option<String>,
    reps: usize,
    rounds: usize,
    only: Option<String>,
    attn_d: usize,
    extra_gemms: Vec<(usize, usize, usize)>,
    /// `--deadline SECS`: no case is started once this many seconds have passed since the start.
    deadline: Option<f64>,
    /// `--tables A,B`: JSON files of earlier runs to print as one table (nothing is measured).
    tables: Option<Vec<String>>,
    /// The measuring options given (none of them applies with `--tables`).
    measuring: Vec<String>,
}

/// The command line, or the message for a bad one.
fn parse(argv: Vec<String>) -> Result<Args, String> {
    let mut args = argv.into_iter();
    let mut o = Args {
        backend: "reference".into(),
        shapes: None,
        vs_torch: false,
        json: None,
        svg_path: None,
        reps: 20,
        rounds: 1,
        only: None,
        attn_d: 128,
        extra_gemms: Vec::new(),
        deadline: None,
        tables: None,
        measuring: Vec::new(),
    };
    while let Some(a) = args.next() {
        if !matches!(a.as_str(), "--json" | "--svg" | "--tables") {
            o.measuring.push(a.clone());
        }
        let mut value = || cli::value_of(&a, &mut args);
        match a.as_str() {
            "--backend" => o.backend = value()?.to_ascii_lowercase(),
            "--shapes" => o.shapes = Some(value()?),
            "--vs" => match value()?.as_str() {
                "torch" => o.vs_torch = true,
                other => return Err(format!("--vs {other:?}: the peers are torch's (--vs torch)")),
            },
            "--json" => o.json = Some(value()?),
            "--svg" => o.svg_path = Some(value()?),
            "--only" => o.only = Some(value()?),
            "--reps" | "--rounds" => {
                let v = value()?;
                let (what, max, slot) =
                    if a == "--reps" { ("calls", 10_000, &mut o.reps) } else { ("rounds", 10, &mut o.rounds) };
                match v.parse::<usize>() {
                    Ok(n @ 1..) if n <= max => *slot = n,
                    _ => return Err(format!("{a} {v:?}: expected a count of {what} from 1 to {max}")),
                }
            }
            "--attn-d" => {
                let v = value()?;
                match v.parse::<usize>() {
                    Ok(d @ (64 | 128 | 256)) => o.attn_d = d,
                    _ => return Err(format!("--attn-d {v:?}: expected a head dim of 64, 128 or 256")),
                }
            }
            "--gemm" => o.extra_gemms = parse_gemm_shapes(&value()?)?,
            "--deadline" => {
                let v = value()?;
                match v.trim().parse::<f64>() {
                    Ok(secs) if (0.0..=86_400.0).contains(&secs) => o.deadline = Some(secs),
                    _ => return Err(format!("--deadline {v:?}: expected seconds from 0 to 86400")),
                }
            }
            "--tables" => {
                let files: Vec<String> = value()?.split(',').filter(|f| !f.is_empty()).map(str::to_string).collect();
                if files.is_empty() {
                    return Err("--tables needs at least one JSON file".into());
                }
                o.tables = Some(files);
            }
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    if o.tables.is_some()
        && let Some(flag) = o.measuring.first()
    {
        return Err(format!("{flag} measures, and --tables only prints saved results: give one or the other"));
    }
    Ok(o)
}

fn main() -> ExitCode {
    let argv = match cli::start(USAGE) {
        Ok(argv) => argv,
        Err(done) => return done,
    };
    // TE-FL's log lines (which impl ran, the Vulkan pipeline statistics) when asked for.
    if std::env::var_os("TEFL_LOG_LEVEL").is_some()
        && let Err(e) = tefl_core::logging::init()
    {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let start = Instant::now();
    let Args {
        backend,
        shapes,
        vs_torch,
        json,
        svg_path,
        reps,
        rounds,
        only,
        attn_d,
        extra_gemms,
        deadline,
        tables,
        ..
    } = match parse(argv) {
        Ok(a) => a,
        Err(e) => return cli::bad_usage("bench", &e, USAGE),
    };
    if let Some(files) = tables {
        return print_saved(&files, json.as_deref(), svg_path.as_deref());
    }
    let (warm_up, peer_flush) = match checked_warm_up_secs().and_then(|w| Ok((w, checked_peer_flush()?))) {
        Ok(checked) => checked,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
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
    // `--only a,b`: the cases whose name contains any of the comma-separated parts; the others'
    // inputs are never made.
    let only = only.map(|o| o.split(',').map(str::to_string).collect());
    let ctx = Ctx { mgr, impl_id: impl_id.clone(), device, only, tensors: std::cell::Cell::new(0) };
    let timer = match Timer::new(device, warm_up) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "bench: backend {backend} ({impl_id}) on {device}, {} shapes, median of up to {reps} calls{}{}{}",
        if small { "small (CPU)" } else { "anchor" },
        if timer.flush.is_some() { ", each after an L2 flush" } else { "" },
        match (timer.flush.is_some() && vs_torch, peer_flush) {
            (false, _) => "",
            (true, "memset") => " (the peers': the CUDA driver's memset)",
            (true, _) => " (the peers': torch's zero_())",
        },
        if rounds > 1 { format!("; each side's fastest of {rounds} rounds in turns") } else { String::new() }
    );
    // Copy bandwidth in the same run (read + write), the memory-bound ops' yardstick.
    let copy_bytes = 256usize << 20;
    let copy_gbps = (|| -> tefl_core::Result<f64> {
        let rt = &timer.rt;
        let (src, dst) = (rt.alloc(device, copy_bytes)?, rt.alloc(device, copy_bytes)?);
        let t = timer.median_secs(reps, &|| rt.copy_device_to_device(&*src, &*dst))?;
        Ok(2.0 * copy_bytes as f64 / t / 1e9)
    })()
    .map_err(|e| println!("copy: {e}"))
    .ok();
    match copy_gbps {
        Some(g) => println!("copy {} MiB: {g:.1} GB/s", copy_bytes >> 20),
        None => println!("copy: no figure, so no fraction of copy"),
    }
    let cases = match cases(&ctx, small, attn_d, &extra_gemms) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("bench: preparing inputs failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    // `--only` that keeps no case (beyond the copy, always measured) is a misspelt name, not
    // an empty benchmark.
    if cases.is_empty()
        && let Some(parts) = &ctx.only
        && parts.iter().any(|p| p != "copy")
    {
        eprintln!(
            "bench: --only {:?} matches no case (names such as \"rmsnorm_fwd\", \"attn_bwd causal\", \"gemm\")",
            parts.join(",")
        );
        return ExitCode::from(2);
    }
    let mut peers = if vs_torch {
        match Peers::new(&device) {
            Ok(p) => Some(p),
            Err(e) => {
                println!("--vs torch: {e}; skipping the comparison");
                None
            }
        }
    } else {
        None
    };
    // Each case: tefl's time, then its peers', `rounds` times in turns; the table once every
    // case is measured.
    let mut measured = Vec::new();
    let mut not_measured = Vec::new();
    let mut progress = Progress::new("bench");
    progress.start("bench", Some(cases.len()));
    for (i, c) in cases.iter().enumerate() {
        // Past the deadline no case is started (the first always is), so that a run under a
        // command's time limit ends with the table of what it measured.
        if i > 0 && deadline.is_some_and(|d| start.elapsed().as_secs_f64() >= d) {
            not_measured.extend(cases[i..].iter().map(|c| c.name.clone()));
            break;
        }
        progress.tick(&c.name);
        let mut mine = Vec::new();
        let mut theirs = Vec::new();
        for round in 0..rounds {
            // Off a terminal, a plain line as tefl's round starts, as the peers' process prints
            // one as each peer starts: a log stamped with times (scripts/diag/with_clocks.sh)
            // then tells which side ran at which clock.
            if !progress.on_terminal() {
                eprintln!("bench: {}: tefl, round {} of {rounds}", c.name, round + 1);
            }
            let t = timer.median_secs(reps, &*c.run);
            progress.clear();
            let failed = t.is_err();
            if let (false, Some(p)) = (failed, peers.as_mut()) {
                theirs.push(p.measure(&c.torch, reps, round));
            }
            mine.push(t);
            if failed {
                break;
            }
        }
        let r = Rounds::of(mine, theirs, peers.is_some());
        if rounds > 1 {
            // Each round's figures as they come, so that a run cut short keeps them.
            let ms = |v: &[f64]| v.iter().map(|x| format!("{:.3}", x * 1e3)).collect::<Vec<_>>().join(" / ");
            let mut line = format!("bench rounds: {}: tefl {}", c.name, ms(&r.each));
            for round in &r.peers_each {
                let found: Vec<String> =
                    round.iter().filter_map(|(p, t)| t.map(|t| format!("{p} {:.3}", t * 1e3))).collect();
                let _ = write!(line, " | {}", found.join(", "));
            }
            progress.clear();
            eprintln!("{line}");
        }
        measured.push((c, r));
    }
    drop(progress);
    if let Some(p) = peers.take() {
        eprintln!("bench peers: {:.0} s in all", p.spent.as_secs_f64());
    }
    // The peer columns this run has, in a fixed order.
    let peer_names: Vec<String> = PEER_ORDER
        .iter()
        .map(|p| p.to_string())
        .filter(|p| measured.iter().any(|(_, r)| r.peers.as_ref().is_some_and(|m| m.contains_key(p))))
        .collect();
    let mut failed = false;
    let mut rows = Vec::new();
    for (c, r) in &measured {
        match &r.best {
            Ok(t) => rows.push(result_json(c, r, *t, copy_gbps, &peer_names)),
            Err(e) => {
                println!("{:<40} error: {e}", c.name);
                failed = true;
            }
        }
    }
    let bars = print_table(&rows);
    if !not_measured.is_empty() {
        println!(
            "bench: the --deadline passed after {} of {} cases; not measured (--only {:?} runs them): {}",
            cases.len() - not_measured.len(),
            cases.len(),
            not_measured.join(","),
            not_measured.join(", ")
        );
    }
    let name = tefl_core::device::runtime(device.kind).map(|r| r.name(device.ordinal)).unwrap_or_default();
    let doc = serde_json::json!({
        "backend": backend, "impl_id": impl_id, "device": device.to_string(), "device_name": name,
        "shapes": if small { "small" } else { "anchor" }, "rounds": rounds, "results": rows,
        "not_measured": not_measured,
    });
    match write_outputs(&doc, &bars, json.as_deref(), svg_path.as_deref()) {
        Ok(()) if failed => ExitCode::FAILURE,
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

/// The peer columns' order (names from another build's JSON follow, sorted).
const PEER_ORDER: [&str; 6] = ["eager", "compile", "flaggems", "sdpa_flash", "sdpa_cudnn", "grouped_mm"];

/// One measured case (tefl's fastest round `t`) as the JSON's `results` keep it: the table is
/// printed from these, for a run and for `--tables` alike.
fn result_json(c: &Case, r: &Rounds, t: f64, copy_gbps: Option<f64>, peer_names: &[String]) -> serde_json::Value {
    let peer_ms = |p: &str| r.peers.as_ref().and_then(|m| m.get(p).copied().flatten());
    let best = peer_names.iter().filter_map(|p| peer_ms(p).map(|x| (p.clone(), x))).min_by(|a, b| a.1.total_cmp(&b.1));
    let peer_json: serde_json::Map<String, serde_json::Value> =
        peer_names.iter().map(|p| (p.clone(), serde_json::json!(peer_ms(p).map(|x| x * 1e3)))).collect();
    serde_json::json!({
        "op": c.name, "median_ms": t * 1e3, "bytes": c.bytes, "flops": c.flops,
        "gbps": if c.bytes > 0.0 { Some(c.bytes / t / 1e9) } else { None },
        "tflops": if c.flops > 0.0 { Some(c.flops / t / 1e12) } else { None },
        "copy_gbps": copy_gbps, "peers_ms": peer_json,
        "best_peer": best.as_ref().map(|b| b.0.clone()), "best_peer_ms": best.as_ref().map(|b| b.1 * 1e3),
        "tefl_speed_vs_best": best.as_ref().map(|b| b.1 / t),
        "rounds_ms": r.each.iter().map(|x| x * 1e3).collect::<Vec<_>>(),
        "peers_rounds_ms": r.peers_each.iter().map(|round| {
            round.iter().map(|(p, x)| (p.clone(), serde_json::json!(x.map(|x| x * 1e3)))).collect::<serde_json::Map<_, _>>()
        }).collect::<Vec<_>>(),
    })
}

/// Prints the table of `rows` (the JSON's `results`): tefl's time and rate, its fraction of
/// the copy bandwidth, the spread of its rounds where it had several, each peer's time, the best
/// peer and tefl's speed relative to it. Returns the chart's bars.
fn print_table(rows: &[serde_json::Value]) -> Vec<Bar> {
    let num = |r: &serde_json::Value, k: &str| r.get(k).and_then(serde_json::Value::as_f64);
    fn peers_of(r: &serde_json::Value) -> Option<&serde_json::Map<String, serde_json::Value>> {
        r.get("peers_ms").and_then(serde_json::Value::as_object)
    }
    let mut extra: Vec<String> = rows
        .iter()
        .filter_map(peers_of)
        .flat_map(|m| m.keys().cloned())
        .filter(|p| !PEER_ORDER.contains(&p.as_str()))
        .collect();
    extra.sort();
    extra.dedup();
    let peer_names: Vec<String> = PEER_ORDER
        .iter()
        .map(|p| p.to_string())
        .chain(extra)
        .filter(|p| rows.iter().filter_map(peers_of).any(|m| m.contains_key(p)))
        .collect();
    let rounds_of = |r: &serde_json::Value| -> Vec<f64> {
        r.get("rounds_ms")
            .and_then(serde_json::Value::as_array)
            .map_or(Vec::new(), |a| a.iter().filter_map(serde_json::Value::as_f64).collect())
    };
    let spread = rows.iter().any(|r| rounds_of(r).len() > 1);
    let mut head = format!("{:<40} {:>10} {:>13} {:>8}", "op", "tefl ms", "rate", "of copy");
    if spread {
        let _ = write!(head, " {:>8}", "spread");
    }
    for p in &peer_names {
        let _ = write!(head, " {:>10}", p);
    }
    if !peer_names.is_empty() {
        let _ = write!(head, " {:>10} {:>10}", "best peer", "tefl speed");
    }
    println!("{head}");
    let mut bars = Vec::new();
    for r in rows {
        let (Some(op), Some(ms)) = (r.get("op").and_then(serde_json::Value::as_str), num(r, "median_ms")) else {
            continue;
        };
        let (rate, frac) = match (num(r, "tflops"), num(r, "gbps")) {
            (Some(tf), _) => (format!("{tf:.1} TFLOP/s"), String::new()),
            (None, Some(g)) => (
                format!("{g:.0} GB/s"),
                num(r, "copy_gbps").map_or(String::new(), |cg| format!("{:.0}%", 100.0 * g / cg)),
            ),
            (None, None) => (String::new(), String::new()),
        };
        let mut line = format!("{op:<40} {ms:>10.3} {rate:>13} {frac:>8}");
        if spread {
            let each = rounds_of(r);
            let lo = each.iter().copied().min_by(f64::total_cmp);
            let hi = each.iter().copied().max_by(f64::total_cmp);
            let s = match (lo, hi) {
                (Some(lo), Some(hi)) if each.len() > 1 => format!("{:.1}%", 100.0 * (hi / lo - 1.0)),
                _ => String::new(),
            };
            let _ = write!(line, " {s:>8}");
        }
        for p in &peer_names {
            let x = peers_of(r).and_then(|m| m.get(p)).and_then(serde_json::Value::as_f64);
            let _ = write!(line, " {:>10}", x.map_or("-".to_string(), |x| format!("{x:.3}")));
        }
        if !peer_names.is_empty() {
            match (r.get("best_peer").and_then(serde_json::Value::as_str), num(r, "best_peer_ms")) {
                (Some(p), Some(x)) => {
                    let _ = write!(line, " {p:>10} {:>9.2}x", x / ms);
                    bars.push(Bar { op: op.to_string(), speed: x / ms, peer: p.to_string() });
                }
                _ => line.push_str(&format!(" {:>10} {:>10}", "-", "-")),
            }
        }
        println!("{line}");
    }
    bars
}

/// Writes the chart (`--svg`) and the JSON document (`--json`); the exit code of a failure.
fn write_outputs(
    doc: &serde_json::Value,
    bars: &[Bar],
    json: Option<&str>,
    svg_path: Option<&str>,
) -> Result<(), ExitCode> {
    let mut failed = false;
    if let Some(path) = svg_path {
        let backend = doc.get("backend").and_then(serde_json::Value::as_str).unwrap_or_default();
        let name = doc.get("device_name").and_then(serde_json::Value::as_str).unwrap_or_default();
        let title =
            format!("tefl {backend} on {name}: speed relative to the best peer (each op with its peers in one run)");
        if bars.is_empty() {
            eprintln!("bench: --svg needs peer times (--vs torch): none to draw");
            failed = true;
        } else if let Err(e) = std::fs::write(path, svg(&title, bars)) {
            eprintln!("bench: writing {path}: {e}");
            return Err(ExitCode::FAILURE);
        } else {
            println!("wrote {path}");
        }
    }
    if let Some(path) = json {
        let mut s = String::new();
        let _ = write!(s, "{doc:#}");
        if let Err(e) = std::fs::write(path, s) {
            eprintln!("bench: writing {path}: {e}");
            return Err(ExitCode::FAILURE);
        }
        println!("wrote {path}");
    }
    if failed { Err(ExitCode::FAILURE) } else { Ok(()) }
}

/// `--tables A,B`: the results of earlier runs' JSON files (`--json`) as one table, chart and
/// JSON, measuring nothing: a run split by `--deadline` and `--only` across commands on the
/// same machine, each op timed with its peers in its own run. The files must come from one
/// backend on one kind of device, and no op may appear twice.
fn print_saved(files: &[String], json: Option<&str>, svg_path: Option<&str>) -> ExitCode {
    match merge_saved(files) {
        Ok(doc) => {
            let list = |k: &str| doc.get(k).and_then(serde_json::Value::as_array).map_or(&[][..], Vec::as_slice);
            let bars = print_table(list("results"));
            let missing: Vec<&str> = list("not_measured").iter().filter_map(serde_json::Value::as_str).collect();
            if !missing.is_empty() {
                println!("bench: not measured in any of the files: {}", missing.join(", "));
            }
            match write_outputs(&doc, &bars, json, svg_path) {
                Ok(()) => ExitCode::SUCCESS,
                Err(code) => code,
            }
        }
        Err(e) => {
            eprintln!("bench: --tables: {e}");
            ExitCode::from(2)
        }
    }
}

/// The merged document of `files`; its `not_measured` lists the ops the files list as not
/// measured that none of them measured.
fn merge_saved(files: &[String]) -> Result<serde_json::Value, String> {
    let text_of = |v: &serde_json::Value, k: &str| v.get(k).and_then(serde_json::Value::as_str).map(str::to_string);
    let mut head: Option<(String, serde_json::Value)> = None;
    let (mut results, mut ops, mut missing) = (Vec::new(), std::collections::BTreeSet::new(), Vec::new());
    let mut rounds = 0;
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"))?;
        let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{f}: not JSON: {e}"))?;
        let rows = doc
            .get("results")
            .and_then(serde_json::Value::as_array)
            .ok_or_else(|| format!("{f}: no \"results\" list (not a bench --json file)"))?;
        // One backend on one kind of device: rows from different machines do not compare.
        for key in ["backend", "device_name", "shapes"] {
            if let Some((first, d)) = &head
                && text_of(d, key) != text_of(&doc, key)
            {
                return Err(format!(
                    "{f} has {key} {:?}, {first} has {:?}: results of different runs' {key} do not go in one table",
                    text_of(&doc, key).unwrap_or_default(),
                    text_of(d, key).unwrap_or_default()
                ));
            }
        }
        for r in rows {
            let op = text_of(r, "op").ok_or_else(|| format!("{f}: a result without its op"))?;
            if !ops.insert(op.clone()) {
                return Err(format!("{f}: {op:?} is in an earlier file too"));
            }
            results.push(r.clone());
        }
        if let Some(list) = doc.get("not_measured").and_then(serde_json::Value::as_array) {
            missing.extend(list.iter().filter_map(serde_json::Value::as_str).map(str::to_string));
        }
        rounds = rounds.max(doc.get("rounds").and_then(serde_json::Value::as_u64).unwrap_or(1));
        if head.is_none() {
            head = Some((f.clone(), doc));
        }
    }
    missing.retain(|op| !ops.contains(op));
    missing.sort();
    missing.dedup();
    let (_, first) = head.ok_or("no files")?;
    Ok(serde_json::json!({
        "backend": first.get("backend"), "impl_id": first.get("impl_id"), "device": first.get("device"),
        "device_name": first.get("device_name"), "shapes": first.get("shapes"), "rounds": rounds,
        "results": results, "not_measured": missing, "merged_from": files,
    }))
}
