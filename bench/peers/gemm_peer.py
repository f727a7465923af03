"""PyTorch peer of bench/bench_gemm.cu: F.linear forward (with and without bias, and bias + tanh
GELU), its backward pieces (grad input = dy @ W, grad weight = dy.T @ x, bias grad = dy.sum(0)),
bf16, at the same shapes and names ("gemm/<direction>/MxNxK", "bias_grad/MxN")."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_util  # noqa: E402

SHAPES = [(2048, 3072, 1024), (2048, 1024, 1024), (2048, 4096, 1024), (2048, 1024, 4096), (2048, 50000, 1024),
          (16384, 4096, 4096), (16384, 16384, 4096)]


def main():
    res = peer_util.Results("PyTorch peer of bench_gemm")
    it = res.iters
    bf = torch.bfloat16
    bias_shapes = []
    for M, N, K in SHAPES:
        sh = f"{M}x{N}x{K}"
        flops = 2.0 * M * N * K
        x = torch.randn(M, K, device="cuda", dtype=bf)
        w = torch.randn(N, K, device="cuda", dtype=bf) * 0.05
        b = torch.randn(N, device="cuda", dtype=bf)
        dy = torch.randn(M, N, device="cuda", dtype=bf)
        pre = torch.randn(M, K, device="cuda", dtype=bf)
        dw32 = torch.zeros(N, K, device="cuda", dtype=torch.float32)

        def add(name, fn):
            t = peer_util.time_us(fn, iters=it)
            res.add(name, t, tflops=round(flops / (t * 1e-6) / 1e12, 1))

        add(f"gemm/fwd/{sh}", lambda: F.linear(x, w))
        add(f"gemm/fwd_bias/{sh}", lambda: F.linear(x, w, b))
        add(f"gemm/fwd_bias_gelu/{sh}", lambda: F.gelu(F.linear(x, w, b), approximate="tanh"))
        # The unfused forms, named like ours (GEMM with bias, then a separate GELU kernel; erf is the
        # model's): the same passes as ours, since autograd keeps F.linear's output as the saved input.
        add(f"gemm/fwd_bias+gelu_kernel/{sh}", lambda: F.gelu(F.linear(x, w, b), approximate="tanh"))
        add(f"gemm/fwd_bias+gelu_erf_kernel/{sh}", lambda: F.gelu(F.linear(x, w, b)))
        add(f"gemm/dgrad/{sh}", lambda: dy @ w)
        add(f"gemm/dgrad+gelu_bwd_kernel/{sh}", lambda: torch.ops.aten.gelu_backward(dy @ w, pre, approximate="tanh"))
        add(f"gemm/dgrad+gelu_erf_bwd_kernel/{sh}", lambda: torch.ops.aten.gelu_backward(dy @ w, pre))
        # grad input through the tanh GELU (what the DGELU epilogue fuses), PyTorch's own backward op.
        add(f"gemm/dgrad_dgelu/{sh}", lambda: torch.ops.aten.gelu_backward(dy @ w, pre, approximate="tanh"))
        add(f"gemm/wgrad/{sh}", lambda: dy.t() @ x)
        # fp32 accumulate of a bf16 product: torch.addmm with out_dtype where this PyTorch has it,
        # else a bf16 product added in fp32 (named as a variant, since it is different work).
        try:
            torch.addmm(dw32, dy.t(), x, out_dtype=torch.float32)
            add(f"gemm/wgrad_f32acc/{sh}", lambda: torch.addmm(dw32, dy.t(), x, out_dtype=torch.float32))
        except (TypeError, RuntimeError):
            add(f"gemm/wgrad_f32acc/{sh}@bf16mm_add", lambda: dw32.add_(dy.t() @ x))
        add(f"gemm/wgrad+bias_grad/{sh}", lambda: (dy.t() @ x, dy.sum(0)))
        for mn in ((M, N), (M, K)):
            if mn not in bias_shapes:
                bias_shapes.append(mn)
        del x, w, b, dy, pre, dw32
        torch.cuda.empty_cache()
    for M, N in bias_shapes:
        dy = torch.randn(M, N, device="cuda", dtype=bf)
        res.add(f"bias_grad/{M}x{N}", peer_util.time_us(lambda: dy.sum(0), iters=it))
        del dy
    res.write()


if __name__ == "__main__":
    main()
