"""The peers of `bench --vs torch`: each anchor op as a PyTorch user can run it today, timed
the way bench times tefl. Reads one `[spec, reps]` line at a time on stdin (spec: "op
size..."), right after bench has timed tefl's case: it prints one JSON line
`[spec, peer, seconds or null]` per peer as soon as it is measured, then `{"done": spec}`, and
waits for the next. What was measured survives a peer that brings the process down (a CUDA
fault poisons the context, so the process also ends itself after a fault it caught): bench
keeps every line it got and starts a new process for its next request.

Peers: torch eager; torch.compile (norms, activations, softmax, RoPE, the FP8 casts, and the rmsnorm
and softmax backwards written out: `formula`); SDPA with the flash and
the cuDNN backends (attention); FlagGems when it is importable: `flag_gems.use_gems()` around
the eager code, and for attention its own `flag_gems.ops.scaled_dot_product_attention` (Triton,
forward and backward). Not `use_gems()` around SDPA: on NVIDIA, FlagGems 5.0.2 replaces only
aten's `_flash_attention_forward`, which SDPA's default backend on Hopper (cuDNN) never calls,
so that measured cuDNN a third time under FlagGems' name.

On CUDA each repetition is an L2 flush (a 256 MiB fill: torch's `zero_()`, or with
TEFL_BENCH_PEER_FLUSH=memset the driver's memset that bench flushes tefl's side with, after the
L2 scrub tefl's side runs too: `l2_scrub`), then CUDA
events around one call, all queued without a host wait, so the device is busy with the flush
while the host queues the call; the median of the repetitions after 3 s of back-to-back calls
as warm-up, as bench warms tefl's (a power-bound kernel slows as the card heats, so both sides
start from the same state). The inputs are uniform in [-0.5, 0.5), as bench's.
"""

import contextlib
import json
import os
import sys
import time

import torch
import torch._dynamo
import torch.nn.functional as F

dev = sys.argv[1]
cuda = dev.startswith("cuda")
bf = torch.bfloat16
flush = torch.empty(256 << 20, dtype=torch.int8, device=dev) if cuda else None


def flusher():
    """What each timed repetition runs first on CUDA: `flush.zero_()` (torch's fill kernel), or
    with TEFL_BENCH_PEER_FLUSH=memset the driver's `cuMemsetD8Async` on torch's current stream,
    the call bench flushes tefl's side with, so that both sides leave the L2 alike (bench refuses
    other values before it starts this process). Where the driver's function cannot be had or
    fails, it says so and flushes with `zero_()`."""
    if os.environ.get("TEFL_BENCH_PEER_FLUSH", "zero") != "memset":
        return flush.zero_
    try:
        import ctypes

        fn = ctypes.CDLL("libcuda.so.1").cuMemsetD8Async
        fn.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p]
        fn.restype = ctypes.c_int

        def memset():
            status = fn(flush.data_ptr(), 0, flush.numel(), torch.cuda.current_stream().cuda_stream)
            if status != 0:
                raise RuntimeError(f"cuMemsetD8Async returned CUresult {status}")

        memset()
        torch.cuda.synchronize()
        return memset
    except Exception as e:
        print(
            f"bench peers: TEFL_BENCH_PEER_FLUSH=memset: the driver's memset failed "
            f"({type(e).__name__}: {e}); flushing with zero_()",
            file=sys.stderr,
            flush=True,
        )
        return flush.zero_


def l2_scrub():
    """What runs before each flush on CUDA, as on tefl's side (tefl-kernels' cuda/l2_scrub.cu,
    which says why): two Triton kernels over the flush buffer's 128-byte lines, the first loading
    each with an L2 evict_last policy (taking the place of the lines that earlier kernels, such as
    torch.compile's, loaded so and never put back, which a fill does not evict), the second
    putting each back to the normal priority, so that the fill after them evicts them. None,
    said on stderr, where Triton cannot be had or the kernels fail: the flush is then the fill
    alone."""
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def each_line(buf, n, ASM: tl.constexpr, BLOCK: tl.constexpr):
            # ASM on the address of each 128-byte line; a use of its result that never stores
            # (the fill overwrites the buffer anyway), so that the compiler keeps a load.
            line = tl.minimum(tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), n - 1)
            v = tl.inline_asm_elementwise(ASM, "=r,l", [buf + line * 32], dtype=tl.int32, is_pure=False, pack=1)
            tl.store(buf + line * 32, v, mask=v == 0x7FC00001)

        keep = (
            "{ .reg .b64 pol; createpolicy.fractional.L2::evict_last.b64 pol, 1.0;"
            " ld.global.L2::cache_hint.b32 $0, [$1], pol; }"
        )
        release = "{ applypriority.global.L2::evict_normal [$1], 128; mov.b32 $0, 0; }"
        words = flush.view(torch.int32)
        lines, block = flush.numel() // 128, 256

        def scrub():
            # Two launches: a line's release must come after its load has filled it.
            for asm in (keep, release):
                each_line[(triton.cdiv(lines, block),)](words, lines, ASM=asm, BLOCK=block)

        scrub()
        torch.cuda.synchronize()
        return scrub
    except Exception as e:
        print(
            f"bench peers: the L2 scrub failed ({type(e).__name__}: {e}); the flush is the fill alone",
            file=sys.stderr,
            flush=True,
        )
        return None


def flush_with_scrub():
    """The flush each timed repetition runs first on CUDA: `l2_scrub`'s kernels, then
    `flusher`'s fill."""
    fill, scrub = flusher(), l2_scrub()
    if scrub is None:
        return fill

    def flush_l2():
        scrub()
        fill()

    return flush_l2


flush_l2 = flush_with_scrub() if cuda else None

try:
    import flag_gems
except Exception as e:  # not installed, or fails to import on this machine
    flag_gems = None
    # The interpreter named, since a wheel installed with another Python's pip (the GPU
    # machine's `pip` is not the Python that holds torch) is not importable here.
    print(
        f"bench peers: FlagGems not importable by {sys.executable} ({type(e).__name__}: {e}); "
        f"install it with `{sys.executable} -m pip`",
        file=sys.stderr,
    )


def t(*s, dt=bf):
    return (torch.rand(*s, device=dev, dtype=torch.float32) - 0.5).to(dt)


def sync():
    if cuda:
        torch.cuda.synchronize()


def warm_up_secs():
    """bench's warm-up: 3 s, or TEFL_BENCH_WARMUP seconds (0.1 to 60)."""
    try:
        v = float(os.environ.get("TEFL_BENCH_WARMUP", "3"))
    except ValueError:
        return 3.0
    return v if 0.1 <= v <= 60.0 else 3.0


WARM_UP_SECS = warm_up_secs()


def timed(f, reps):
    f()
    sync()
    warm = time.perf_counter()
    while time.perf_counter() - warm < WARM_UP_SECS:
        f()
    sync()
    ts = []
    if cuda:
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for a, b in ev:
            flush_l2()
            a.record()
            f()
            b.record()
        sync()
        ts = [a.elapsed_time(b) / 1e3 for a, b in ev]
    else:
        for _ in range(reps):
            a = time.perf_counter()
            f()
            ts.append(time.perf_counter() - a)
    ts.sort()
    return ts[len(ts) // 2]


def eager(op, a):
    """The op in torch eager (a callable), and whether torch.compile applies to it."""
    if op == "rmsnorm_fwd":
        x, g = t(a[0], a[1]), t(a[1])
        return (lambda: F.rms_norm(x, (a[1],), g, 1e-5)), True
    if op == "rmsnorm_fp8":
        x, g = t(a[0], a[1]), t(a[1])
        s = torch.ones((), device=x.device)

        # As TE's norm with an FP8 output (and tefl's): the codes of y * scale and max |y|, the
        # amax that delayed scaling needs (the quantize peers below take theirs too).
        def f():
            y = F.rms_norm(x, (a[1],), g, 1e-5)
            return (y * s).to(torch.float8_e4m3fn), y.abs().amax().float()

        return f, True
    if op == "rmsnorm_bwd":
        x = t(a[0], a[1]).requires_grad_()
        g = t(a[1]).requires_grad_()
        y = F.rms_norm(x, (a[1],), g, 1e-5)
        dy = t(a[0], a[1])
        return (lambda: torch.autograd.grad(y, (x, g), dy, retain_graph=True)), False
    if op == "layernorm_fwd":
        x, g = t(a[0], a[1]), t(a[1])
        return (lambda: F.layer_norm(x, (a[1],), g, g, 1e-5)), True
    if op == "layernorm_bwd":
        x = t(a[0], a[1]).requires_grad_()
        g, beta = t(a[1]).requires_grad_(), t(a[1]).requires_grad_()
        y = F.layer_norm(x, (a[1],), g, beta, 1e-5)
        dy = t(a[0], a[1])
        return (lambda: torch.autograd.grad(y, (x, g, beta), dy, retain_graph=True)), False
    if op == "gelu":
        x = t(a[0], a[1])
        return (lambda: F.gelu(x, approximate="tanh")), True
    if op == "swiglu":
        x = t(a[0], 2 * a[1])
        return (lambda: (lambda u, v: F.silu(u) * v)(*x.chunk(2, -1))), True
    if op == "softmax":
        x = t(a[0], a[1])
        return (lambda: torch.softmax(x * 0.125, -1)), True
    if op == "softmax_bwd":
        x = t(a[0], a[1]).requires_grad_()
        y = torch.softmax(x * 0.125, -1)
        dy = t(a[0], a[1])
        return (lambda: torch.autograd.grad(y, x, dy, retain_graph=True)), False
    if op == "rope":
        s, b, h, d = a
        x = t(s, b, h, d)
        fr = t(s, 1, 1, d, dt=torch.float32)
        c, sn = fr.cos().to(bf), fr.sin().to(bf)
        return (lambda: x * c + torch.cat((-x[..., d // 2 :], x[..., : d // 2]), -1) * sn), True
    if op in ("quantize", "quantize_t"):
        # TE's cast: the codes of x * scale, max |x|, and (quantize_t) the codes' transpose.
        x = t(a[0], a[1])
        s = torch.ones((), device=x.device)

        def f():
            q = (x.float() * s).to(torch.float8_e4m3fn)
            return q, x.abs().amax().float(), q.t().contiguous() if op == "quantize_t" else None

        return f, True
    if op in ("gemm", "gemm_f16"):
        m = a[0]
        x = t(m, m, dt=torch.float16 if op == "gemm_f16" else bf)
        return (lambda: x @ x), False
    if op == "gemm_mnk":
        m, n, k = a
        x, w = t(m, k), t(k, n)
        return (lambda: x @ w), False
    if op == "gemm_fp8":
        m = a[0]
        x = t(m, m).to(torch.float8_e4m3fn)
        one = torch.ones((), device=x.device)
        return (lambda: torch._scaled_mm(x, x.t(), one, one, out_dtype=bf, use_fast_accum=True)), False
    if op == "grouped_gemm":
        kn, ms = a[0], a[1:]
        xs = [t(m, kn) for m in ms]
        ws = [t(kn, kn) for _ in ms]
        return (lambda: [x @ w.t() for x, w in zip(xs, ws)]), False
    if op == "grouped_gemm_fp8":
        # TE's FP8 forward per expert: e4m3 TN, bf16 out, fast accumulation.
        kn, ms = a[0], a[1:]
        xs = [t(m, kn).to(torch.float8_e4m3fn) for m in ms]
        ws = [t(kn, kn).to(torch.float8_e4m3fn) for _ in ms]
        one = torch.ones((), device=xs[0].device)
        return (
            lambda: [torch._scaled_mm(x, w.t(), one, one, out_dtype=bf, use_fast_accum=True) for x, w in zip(xs, ws)]
        ), False
    if op == "grouped_gemm_torch":
        kn, ms = a[0], a[1:]
        x = t(sum(ms), kn)
        w = t(len(ms), kn, kn)
        offs = torch.tensor(ms, device=x.device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        return (lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)), False
    if op == "adam":
        p = torch.nn.Parameter(t(a[0], dt=torch.float32))
        p.grad = t(a[0], dt=torch.float32)
        opt = torch.optim.AdamW([p], lr=1e-4, fused=cuda)
        return opt.step, False
    return None, False


def attention(op, a, sdpa=None):
    """The callable for attn_fwd / attn_bwd (causal, bhsd) of `sdpa` (SDPA's signature; torch's
    by default). q, k and v are tensors of their own, as tefl's in bench: with one tensor for all
    three, autograd would add the three gradients into one (two more passes over them) and time
    that with the backward."""
    sdpa = sdpa or F.scaled_dot_product_attention
    b, h, s, d = a
    q, k, v = (t(b, h, s, d).requires_grad_(op == "attn_bwd") for _ in range(3))
    if op == "attn_fwd":
        return lambda: sdpa(q, k, v, is_causal=True)
    o = sdpa(q, k, v, is_causal=True)
    do = t(b, h, s, d)
    return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)


FORMULAS = ("rmsnorm_bwd", "layernorm_bwd", "softmax_bwd")


def formula(op, a):
    """The backward ops written out for torch.compile, with the inputs tefl's op takes (the
    saved forward results instead of autograd's graph; eager's autograd peer also runs the
    softmax's scaling backward as a pass of its own): what a compiled model's backward computes."""
    if op == "rmsnorm_bwd":
        x, g, dy = t(a[0], a[1]), t(a[1]), t(a[0], a[1])
        rs = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-5)

        def f():
            xhat = x.float() * rs[:, None]
            dyg = dy.float() * g.float()
            dx = rs[:, None] * (dyg - xhat * (dyg * xhat).mean(-1, keepdim=True))
            return dx.to(bf), (dy.float() * xhat).sum(0).to(bf)

        return f
    if op == "layernorm_bwd":
        x, g, dy = t(a[0], a[1]), t(a[1]), t(a[0], a[1])
        mu = x.float().mean(-1)
        rs = torch.rsqrt(x.float().var(-1, unbiased=False) + 1e-5)

        def f():
            xhat = (x.float() - mu[:, None]) * rs[:, None]
            dyg = dy.float() * g.float()
            dx = rs[:, None] * (dyg - dyg.mean(-1, keepdim=True) - xhat * (dyg * xhat).mean(-1, keepdim=True))
            return dx.to(bf), (dy.float() * xhat).sum(0).to(bf), dy.float().sum(0).to(bf)

        return f
    if op == "softmax_bwd":
        y, dy = torch.softmax(t(a[0], a[1]).float(), -1).to(bf), t(a[0], a[1])

        def f():
            yf, dyf = y.float(), dy.float()
            return (0.125 * yf * (dyf - (dyf * yf).sum(-1, keepdim=True))).to(bf)

        return f
    return None


def peers(op, a):
    """(peer name, context manager to time it in, setup returning the callable) per peer."""
    if op in ("attn_fwd", "attn_bwd"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if not cuda:
            return [("eager", lambda: sdpa_kernel(SDPBackend.MATH), lambda: attention(op, a))]
        out = [
            ("sdpa_flash", lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION), lambda: attention(op, a)),
            ("sdpa_cudnn", lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION), lambda: attention(op, a)),
        ]
        if flag_gems is not None:
            gems_sdpa = flag_gems.ops.scaled_dot_product_attention
            out.append(("flaggems", contextlib.nullcontext, lambda: attention(op, a, gems_sdpa)))
        return out
    f, compiles = eager(op, a)
    if f is None:
        return []
    out = [("eager", contextlib.nullcontext, lambda: f)]
    if compiles:
        out.append(("compile", contextlib.nullcontext, lambda: torch.compile(eager(op, a)[0])))
    elif cuda and op in FORMULAS:
        out.append(("compile", contextlib.nullcontext, lambda: torch.compile(formula(op, a))))
    if op == "grouped_gemm":
        # torch's grouped kernel (CUTLASS on sm_90) beside the per-expert loop of matmuls.
        out.append(("grouped_mm", contextlib.nullcontext, lambda: eager("grouped_gemm_torch", a)[0]))
    if flag_gems is not None and op not in ("adam", "gemm_fp8", "grouped_gemm", "grouped_gemm_fp8"):
        out.append(("flaggems", flag_gems.use_gems, lambda: eager(op, a)[0]))
    return out


def context_ok():
    """Whether this process's CUDA context still works: a fault (an illegal memory access) is
    sticky, so every later call in the process would fail with it too."""
    try:
        torch.cuda.synchronize()
        return True
    except Exception:
        return False


for line in sys.stdin:
    if not line.strip():
        continue
    spec, reps = json.loads(line)
    # Each spec's compiled callables start from dynamo's empty state, as in a process of their
    # own: a second shape of the same function would otherwise be compiled with dynamic shapes.
    torch._dynamo.reset()
    w = spec.split()
    op, a = w[0], [int(x) for x in w[1:]]
    for name, ctx, setup in peers(op, a):
        print(f"bench peers: {spec}: {name}", file=sys.stderr, flush=True)
        fault = False
        try:
            with ctx():
                secs = timed(setup(), reps)
        except Exception as e:
            secs = None
            print(f"bench peers: {name} {spec}: {type(e).__name__}: {e}", file=sys.stderr)
            fault = cuda and not context_ok()
        print(json.dumps([spec, name, secs]), flush=True)
        if fault:
            # bench starts a new process for its next request (this spec's later peers are lost
            # for this round); staying, every later peer would fail on the poisoned context.
            print(f"bench peers: the CUDA context is lost after {name} on '{spec}'", file=sys.stderr, flush=True)
            sys.exit(1)
        if cuda:
            torch.cuda.empty_cache()
    print(json.dumps({"done": spec}), flush=True)
