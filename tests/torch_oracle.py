#!/usr/bin/env python3
"""torch as an independent oracle for tefl's kernels.

Usage: torch_oracle <backend> DIR && python3 tests/torch_oracle.py DIR

`torch_oracle` (tests/src/bin/torch_oracle.rs) runs rmsnorm fwd/bwd, layernorm fwd/bwd, gemm,
attention fwd/bwd, swiglu fwd/bwd and AdamW on a tefl backend and writes every input and output
as raw f32 with a manifest. This script recomputes each case with PyTorch in float64 from the
same inputs (the inputs are exactly representable, so the oracle sees what tefl saw) and prints
max |tefl - torch| and that error relative to max |torch| per output. It exits 1 when an error
exceeds the tolerance of the case's dtype. FP8 outputs are judged as roundings instead: each
value within one e4m3 step of torch's (a value at a near-tie may round either way from tefl's
f32 arithmetic and torch's f64), and at most one in a thousand not equal to it.
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# Relative (to max |reference|) tolerance per dtype: bf16 keeps 8 bits, f32 accumulates.
TOL = {"bf16": 2e-2, "f16": 4e-3, "f32": 2e-4, "f8e4m3": 7e-2}
# Outputs stored as FP8 (e4m3), per oracle: compared step by step, not relative to the maximum (one
# step at the top binade is 6-12% of it, so a single near-tie rounding otherwise failed a run).
FP8_OUTPUTS = {"rmsnorm_fp8": {"y"}}


def e4m3_step(a):
    """The spacing of e4m3 values at magnitude a (3 mantissa bits, normals from 2^-6)."""
    return torch.pow(2.0, torch.floor(torch.log2(a.clamp(min=2.0**-6))) - 3)


def fp8_verdict(got, want):
    """(max error in e4m3 steps, fraction of values that differ, ok)."""
    steps = ((got - want).abs() / e4m3_step(want.abs())).max().item()
    differ = (got != want).double().mean().item()
    return steps, differ, steps <= 1.0 and differ <= 1e-3


def load(d, entry):
    a = np.fromfile(os.path.join(d, entry["file"]), dtype="<f4").reshape(entry["shape"])
    return torch.from_numpy(a).to(DEV, torch.float64)


def rmsnorm(t, p):
    x, g, dy = t["x"].clone().requires_grad_(), t["gamma"].clone().requires_grad_(), t["dy"]
    y = F.rms_norm(x, (x.shape[-1],), g, p["eps"])
    dx, dg = torch.autograd.grad(y, (x, g), dy)
    return {"y": y, "dx": dx, "dgamma": dg}


def layernorm(t, p):
    x = t["x"].clone().requires_grad_()
    g, b = t["gamma"].clone().requires_grad_(), t["beta"].clone().requires_grad_()
    y = F.layer_norm(x, (x.shape[-1],), g, b, p["eps"])
    dx, dg, db = torch.autograd.grad(y, (x, g, b), t["dy"])
    return {"y": y, "dx": dx, "dgamma": dg, "dbeta": db}


def gemm(t, p):
    a = t["a"].T if p["transa"] else t["a"]
    b = t["b"].T if p["transb"] else t["b"]
    return {"d": torch.matmul(a, b) + t["bias"]}


def gemm_fp8(t, p):
    # The FP8 values are exact in f64; torch._scaled_mm (bench) is the fast peer, f64 the oracle.
    return {"d": torch.matmul(t["a"] * p["sa"], (t["b"] * p["sb"]).T)}


def grouped(t, p):
    # A per-expert loop of f64 matmuls.
    s = p["scale"]
    return {f"d{g}": torch.matmul(t[f"a{g}"] * s, t[f"b{g}"].T) for g in range(p["groups"])}


def rmsnorm_fp8(t, p):
    # The exact normalised values cast to e4m3 by torch after the scale (what TE's quantizer
    # writes), compared after unscaling; amax before scaling.
    y = F.rms_norm(t["x"], (t["x"].shape[-1],), t["gamma"], p["eps"])
    q = (y * p["scale"]).to(torch.float32).to(torch.float8_e4m3fn).to(torch.float64)
    return {"y": q, "amax": y.abs().max().reshape(1)}


def attention(t, p):
    if p.get("cu") is None:
        return attention_bshd(t, p)
    # thd: each sequence as a batch of one (its rows of q, k, v, dO), the results joined along
    # the tokens (lse: [heads, tokens]).
    cu = p["cu"]
    parts = [attention_bshd({n: t[n][None, a:b] for n in ("q", "k", "v", "d_o")}, p) for a, b in zip(cu, cu[1:])]
    out = {n: torch.cat([x[n] for x in parts], 1)[0] for n in ("o", "dq", "dk", "dv")}
    out["lse"] = torch.cat([x["lse"] for x in parts], 2)[0]
    return out


def attention_bshd(t, p):
    # bshd -> bhsd; GQA through enable_gqa.
    q, k, v = (t[n].transpose(1, 2).clone().requires_grad_() for n in ("q", "k", "v"))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=p["causal"], scale=p["scale"], enable_gqa=True)
    do = t["d_o"].transpose(1, 2)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    s = torch.matmul(q, k.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2)) * p["scale"]
    if p["causal"]:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return {
        "o": o.transpose(1, 2),
        "lse": lse,
        "dq": dq.transpose(1, 2),
        "dk": dk.transpose(1, 2),
        "dv": dv.transpose(1, 2),
    }


def swiglu(t, p):
    x = t["x"].clone().requires_grad_()
    a, b = x.chunk(2, -1)
    y = F.silu(a) * b
    (dx,) = torch.autograd.grad(y, x, t["grad"])
    return {"y": y, "dx": dx}


def adamw(t, p):
    param = torch.nn.Parameter(t["p0"].clone())
    opt = torch.optim.AdamW(
        [param], lr=p["lr"], betas=(p["beta1"], p["beta2"]), eps=p["eps"], weight_decay=p["weight_decay"]
    )
    param.grad = t["g"].clone()
    # Resume from step - 1 with the recorded moments, then take one step.
    opt.state[param] = {
        "step": torch.tensor(float(p["step"] - 1), dtype=torch.float64),
        "exp_avg": t["m0"].clone(),
        "exp_avg_sq": t["v0"].clone(),
    }
    opt.step()
    st = opt.state[param]
    return {"p": param.detach(), "m": st["exp_avg"], "v": st["exp_avg_sq"]}


ORACLES = {
    "rmsnorm": rmsnorm,
    "layernorm": layernorm,
    "gemm": gemm,
    "attention": attention,
    "swiglu": swiglu,
    "adamw": adamw,
    "gemm_fp8": gemm_fp8,
    "grouped": grouped,
    "rmsnorm_fp8": rmsnorm_fp8,
}


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    d = sys.argv[1]
    with open(os.path.join(d, "manifest.json")) as f:
        manifest = json.load(f)
    print(f"torch {torch.__version__} on {DEV}; tefl impl {manifest['impl']}, seed {manifest['seed']}")
    print(f"{'case':34} {'output':8} {'max abs err':>12} {'rel to max':>11}  verdict")
    failed = 0
    passed = 0
    for case in manifest["cases"]:
        t = {name: load(d, e) for name, e in case["tensors"].items()}
        with torch.enable_grad():
            ref = ORACLES[case["op"]](t, case["params"])
        tol = TOL[case["dtype"]]
        for name, want in ref.items():
            got = t[name]
            want = want.detach()
            if want.numel() == 0:
                # An empty output (a group no token chose) must be empty too.
                ok = got.shape == want.shape
                passed += ok
                failed += not ok
                print(f"{case['case']:34} {name:8} {'(empty)':>12} {'':>11}  {'ok' if ok else 'FAIL'}")
                continue
            if name in FP8_OUTPUTS.get(case["op"], ()):
                steps, differ, ok = fp8_verdict(got, want)
                passed += ok
                failed += not ok
                verdict = "ok" if ok else "FAIL"
                print(f"{case['case']:34} {name:8} {steps:7.2f} st {differ:11.3e}  {verdict} (e4m3 steps, fraction differing)")
                continue
            err = (got - want).abs().max().item()
            scale = max(want.abs().max().item(), 1e-30)
            rel = err / scale
            ok = rel <= tol and np.isfinite(err)
            passed += ok
            failed += not ok
            print(f"{case['case']:34} {name:8} {err:12.3e} {rel:11.3e}  {'ok' if ok else 'FAIL'}")
    print(f"torch oracle: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
