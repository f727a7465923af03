"""PyTorch peer of bench/bench_k3.cu, same names:
  cross_entropy/fwdbwd/<rows>x<vocab>@torch_upcast   F.cross_entropy(logits.float(), y), fwd+bwd
  cross_entropy/fwdbwd/<rows>x<vocab>@torch_bf16     F.cross_entropy(logits, y) on bf16 logits
      (each with extra_peak_bytes: torch.cuda.max_memory_allocated() minus the allocation before)
  adamw/baseline/<n>@torch_fused_fp32                torch.optim.AdamW(fused=True), fp32 params/grads
  adamw/bf16_master_wg/<n>@torch_fused_bf16          the same on bf16 params (its states are bf16)
  adamw/bf16_full/<n>@torch_fused_bf16
  grad_norm/<bf16|fp32>/<n>@torch_vector_norm        torch.linalg.vector_norm of the flat gradient
  grad_norm/<bf16|fp32>/<n>@torch_clip_grad_norm     torch.nn.utils.clip_grad_norm_ (norm + scaling)
The parameters are one flat tensor, as our optimizer sees them (PyTorch's best case)."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_util  # noqa: E402


def extra_peak(fn):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def cross_entropy(res, rows, vocab):
    name = f"cross_entropy/fwdbwd/{rows}x{vocab}"
    logits = (4 * torch.randn(rows, vocab, device="cuda")).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, vocab, (rows,), device="cuda")

    def upcast():
        loss = F.cross_entropy(logits.float(), y)
        return torch.autograd.grad(loss, logits)

    def direct():
        loss = F.cross_entropy(logits, y)
        return torch.autograd.grad(loss, logits)

    for variant, fn in (("torch_upcast", upcast), ("torch_bf16", direct)):
        try:
            peak = extra_peak(fn)
            res.add(f"{name}@{variant}", peer_util.time_us(fn, iters=res.iters), extra_peak_bytes=peak)
        except torch.cuda.OutOfMemoryError:
            print(f"{name}@{variant}: out of memory", file=sys.stderr)
        torch.cuda.empty_cache()
    del logits


def adamw(res, n):
    for dtype, names in ((torch.float32, ["adamw/baseline"]),
                         (torch.bfloat16, ["adamw/bf16_master_wg", "adamw/bf16_full"])):
        p = torch.nn.Parameter(0.05 * torch.randn(n, device="cuda", dtype=dtype))
        p.grad = 1e-3 * torch.randn(n, device="cuda", dtype=dtype)
        opt = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True)
        opt.step()  # allocates the states
        t = peer_util.time_us(opt.step, iters=res.iters)
        variant = "torch_fused_fp32" if dtype == torch.float32 else "torch_fused_bf16"
        for nm in names:
            res.add(f"{nm}/{n}@{variant}", t)
        del opt, p
        torch.cuda.empty_cache()


def grad_norm(res, n):
    for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        p = torch.nn.Parameter(torch.zeros(n, device="cuda", dtype=dtype))
        p.grad = 1e-2 * torch.randn(n, device="cuda", dtype=dtype)
        g = p.grad
        res.add(f"grad_norm/{tag}/{n}@torch_vector_norm",
                peer_util.time_us(lambda: torch.linalg.vector_norm(g), iters=res.iters))
        res.add(f"grad_norm/{tag}/{n}@torch_clip_grad_norm",
                peer_util.time_us(lambda: torch.nn.utils.clip_grad_norm_([p], 1.0), iters=res.iters))
        del p, g
        torch.cuda.empty_cache()


def main():
    res = peer_util.Results(__doc__.splitlines()[0])
    for rows, vocab in ((2048, 50000), (8192, 50304), (16384, 50304), (8192, 50257), (2048, 262144)):
        cross_entropy(res, rows, vocab)
    for n in (254128976, 1300000000):
        adamw(res, n)
    for n in (254128976, 1300000000):
        grad_norm(res, n)
    res.write()


if __name__ == "__main__":
    main()
