"""Trains one transformer block twice from the same initial weights: with ``tefl.torch`` layers
and with ``torch.nn`` layers (SDPA for attention), then prints both loss curves side by side
and the step times.

    python examples/python/train_block.py [--steps 30] [--device cuda|cpu] [--dtype bf16|f32]

The block: RMSNorm → fused QKV Linear → causal attention → output Linear → residual → RMSNorm
→ SwiGLU MLP → residual; the loss is the mean squared error against a fixed random target;
AdamW (torch's) updates both models alike.
"""

import argparse
import os

# On the CPU, torch's OpenMP threads spin for a while after each torch op (libgomp's default
# wait policy) and keep the cores from tefl's threads; "PASSIVE" lets them sleep instead. It
# must be set before torch starts OpenMP, so here, before torch is imported; a value already
# in the environment is kept. (It changes nothing for CUDA tensors.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import copy
import time

import torch
import torch.nn.functional as F

import tefl.torch as tt


class Block(torch.nn.Module):
    def __init__(self, hidden, heads, ffn, use_tefl, device, dtype):
        super().__init__()
        self.heads, self.use_tefl = heads, use_tefl
        kw = dict(device=device, dtype=dtype)
        if use_tefl:
            self.norm1, self.norm2 = tt.RMSNorm(hidden, **kw), tt.RMSNorm(hidden, **kw)
            self.qkv, self.out = tt.Linear(hidden, 3 * hidden, bias=False, **kw), tt.Linear(hidden, hidden, bias=False, **kw)
            self.fc1, self.fc2 = tt.Linear(hidden, 2 * ffn, bias=False, **kw), tt.Linear(ffn, hidden, bias=False, **kw)
            self.attn = tt.DotProductAttention(heads, causal=True)
        else:
            self.norm1, self.norm2 = torch.nn.RMSNorm(hidden, eps=1e-5, **kw), torch.nn.RMSNorm(hidden, eps=1e-5, **kw)
            self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False, **kw)
            self.out = torch.nn.Linear(hidden, hidden, bias=False, **kw)
            self.fc1 = torch.nn.Linear(hidden, 2 * ffn, bias=False, **kw)
            self.fc2 = torch.nn.Linear(ffn, hidden, bias=False, **kw)

    def forward(self, x):
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(self.norm1(x)).reshape(b, s, 3, self.heads, d).unbind(2)
        if self.use_tefl:
            a = self.attn(q, k, v)
        else:
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            a = a.transpose(1, 2)
        x = x + self.out(a.reshape(b, s, h))
        h2 = self.fc1(self.norm2(x))
        if self.use_tefl:
            m = tt.swiglu(h2)
        else:
            g, u = h2.chunk(2, dim=-1)
            m = F.silu(g) * u
        return x + self.fc2(m)


def train(model, x, target, steps, lr):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses, times = [], []
    for _ in range(steps):
        if x.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x).float(), target)
        loss.backward()
        opt.step()
        if x.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return losses, times


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=["bf16", "f32"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=1408)
    p.add_argument("--lr", type=float, default=1e-3)
    a = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[a.dtype or ("bf16" if a.device == "cuda" else "f32")]
    torch.manual_seed(0)
    ref = Block(a.hidden, a.heads, a.ffn, False, a.device, dtype)
    ours = Block(a.hidden, a.heads, a.ffn, True, a.device, dtype)
    ours.load_state_dict(copy.deepcopy(ref.state_dict()))
    x = torch.randn(a.batch, a.seq, a.hidden, device=a.device, dtype=dtype)
    target = torch.randn(a.batch, a.seq, a.hidden, device=a.device, dtype=torch.float32)
    l_ref, t_ref = train(ref, x, target, a.steps, a.lr)
    l_ours, t_ours = train(ours, x, target, a.steps, a.lr)
    print(
        f"device {a.device}, {dtype}, batch {a.batch} seq {a.seq} hidden {a.hidden} heads {a.heads} ffn {a.ffn}; "
        f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}"
    )
    print(f"{'step':>4} {'torch.nn loss':>14} {'tefl.torch loss':>16} {'rel diff':>9}")
    worst = 0.0
    for i, (lr_, lo) in enumerate(zip(l_ref, l_ours)):
        rel = abs(lo - lr_) / max(abs(lr_), 1e-12)
        worst = max(worst, rel)
        print(f"{i:>4} {lr_:>14.6f} {lo:>16.6f} {rel:>9.2e}")
    warm = slice(min(3, a.steps - 1), None)
    med = lambda v: sorted(v)[len(v) // 2] * 1e3
    print(f"step time (median after warm-up): torch.nn {med(t_ref[warm]):.2f} ms, tefl.torch {med(t_ours[warm]):.2f} ms")
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    print(f"largest relative loss difference {worst:.2e} (tolerance {tol:.0e}): {'OK' if worst < tol else 'DIFFERS'}")
    return 0 if worst < tol else 1


if __name__ == "__main__":
    raise SystemExit(main())
