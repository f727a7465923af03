"""PyTorch peer of bench/bench_dense.cu: LayerNorm with the residual add (F.layer_norm(x + res)),
F.gelu (exact erf) and the token + position embedding, forward, backward and forward+backward,
bf16, at the same shapes and names ("layernorm/fwdbwd/16384x4096", "gelu/fwd/2048x4096",
"embedding/bwd/2048x1024", ...)."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_util  # noqa: E402

BF = torch.bfloat16


def layernorm(res, rows, cols):
    it = res.iters
    sh = f"{rows}x{cols}"
    x = torch.randn(rows, cols, device="cuda", dtype=BF, requires_grad=True)
    r = torch.randn(rows, cols, device="cuda", dtype=BF, requires_grad=True)
    g = (1 + 0.2 * torch.randn(cols, device="cuda")).to(BF).requires_grad_()
    b = (0.2 * torch.randn(cols, device="cuda")).to(BF).requires_grad_()
    dy = torch.randn(rows, cols, device="cuda", dtype=BF)
    with torch.no_grad():
        res.add(f"layernorm/fwd/{sh}", peer_util.time_us(lambda: F.layer_norm(x + r, (cols,), g, b), iters=it))
        s = x + r
        _, mean, rstd = torch.ops.aten.native_layer_norm(s, [cols], g, b, 1e-5)
        res.add(f"layernorm/bwd/{sh}", peer_util.time_us(
            lambda: torch.ops.aten.native_layer_norm_backward(dy, s, [cols], mean, rstd, g, b, [True, True, True]),
            iters=it))

    def fwdbwd():
        y = F.layer_norm(x + r, (cols,), g, b)
        torch.autograd.grad(y, (x, r, g, b), dy)
    res.add(f"layernorm/fwdbwd/{sh}", peer_util.time_us(fwdbwd, iters=it))


def gelu(res, rows, cols):
    it = res.iters
    sh = f"{rows}x{cols}"
    x = (3 * torch.randn(rows, cols, device="cuda")).to(BF).requires_grad_()
    dy = torch.randn(rows, cols, device="cuda", dtype=BF)
    with torch.no_grad():
        res.add(f"gelu/fwd/{sh}", peer_util.time_us(lambda: F.gelu(x), iters=it))
        res.add(f"gelu/bwd/{sh}", peer_util.time_us(lambda: torch.ops.aten.gelu_backward(dy, x), iters=it))

    def fwdbwd():
        torch.autograd.grad(F.gelu(x), (x,), dy)
    res.add(f"gelu/fwdbwd/{sh}", peer_util.time_us(fwdbwd, iters=it))


def embedding(res, B, T, C, V):
    it = res.iters
    sh = f"{B * T}x{C}"
    tok = torch.randint(0, V, (B, T), device="cuda")
    pos = torch.arange(T, device="cuda")
    wte = torch.randn(V, C, device="cuda", dtype=BF, requires_grad=True)
    wpe = torch.randn(T, C, device="cuda", dtype=BF, requires_grad=True)
    dy = torch.randn(B, T, C, device="cuda", dtype=BF)
    with torch.no_grad():
        res.add(f"embedding/fwd/{sh}", peer_util.time_us(lambda: F.embedding(tok, wte) + F.embedding(pos, wpe),
                                                         iters=it))
    out = F.embedding(tok, wte) + F.embedding(pos, wpe)
    res.add(f"embedding/bwd/{sh}", peer_util.time_us(
        lambda: torch.autograd.grad(out, (wte, wpe), dy, retain_graph=True), iters=it))


def main():
    res = peer_util.Results("PyTorch peer of bench_dense")
    for rows, cols in [(2048, 1024), (16384, 4096)]:
        layernorm(res, rows, cols)
    for rows, cols in [(2048, 4096), (16384, 16384)]:
        gelu(res, rows, cols)
    for B, T, C in [(4, 512, 1024), (32, 512, 4096)]:
        embedding(res, B, T, C, 50000)
    res.write()


if __name__ == "__main__":
    main()
