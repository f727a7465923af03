"""PyTorch peer of bench/bench_attention.cu: F.scaled_dot_product_attention on views of the same
fused [B, S, 3, H, D] bf16 tensor (no permute copies in front of it), forward, backward (gradient
into the fused tensor, as ours writes dqkv) and forward+backward, full and causal, under the same
names ("attention/<fwd|bwd|fwdbwd>[_causal]/B4H16S512D64") with variants @default (PyTorch's own
choice), @flash and @cudnn (forced through torch.nn.attention.sdpa_kernel).
BERT's shapes (B64H16S128D64, B16H16S512D64, non-causal) also run as "attention/<pass>_mask/..."
(attn_mask: a boolean key mask [B, 1, 1, S] of random per-sequence lengths in [S/4, S]) and
"attention/<pass>_mask_drop/..." (the same mask and dropout_p=0.1), as bench_attention names them;
a backend that refuses a mask or dropout is skipped with a note."""
import contextlib
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_util  # noqa: E402

SHAPES = [(4, 16, 512, 64), (4, 16, 2048, 64), (2, 16, 8192, 64), (4, 16, 2048, 128)]
BERT_SHAPES = [(64, 16, 128, 64), (16, 16, 512, 64)]


def padding_mask(B, S):
    """[B, 1, 1, S] bool, True where the key may be attended: lengths uniform in [S/4, S]."""
    g = torch.Generator().manual_seed(7)
    lengths = torch.randint(S // 4, S + 1, (B,), generator=g)
    return (torch.arange(S)[None, :] < lengths[:, None]).view(B, 1, 1, S).cuda()


def backends():
    out = [("default", contextlib.nullcontext)]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        out.append(("flash", lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)))
        out.append(("cudnn", lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)))
    except ImportError:
        print("peer: torch.nn.attention.sdpa_kernel missing; only @default", file=sys.stderr)
    return out


def main():
    res = peer_util.Results("PyTorch peer of bench_attention")
    it = res.iters
    for B, H, S, D in SHAPES:
        shape = f"B{B}H{H}S{S}D{D}"
        qkv = torch.randn(B, S, 3, H, D, device="cuda", dtype=torch.bfloat16).requires_grad_(True)
        dout = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        for causal in (False, True):
            fwd_flops = 4.0 * B * H * S * S * D / (2 if causal else 1)
            suffix = ("_causal/" if causal else "/") + shape

            def forward():
                q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B, H, S, D] views
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            for variant, ctx in backends():
                try:
                    with ctx():
                        o = forward()
                        torch.autograd.grad(o, qkv, dout, retain_graph=True)
                        torch.cuda.synchronize()

                        def add(name, fn, flops):
                            t = peer_util.time_us(fn, iters=it)
                            res.add(f"attention/{name}{suffix}@{variant}", t,
                                    tflops=round(flops / (t * 1e-6) / 1e12, 1))

                        with torch.no_grad():
                            add("fwd", forward, fwd_flops)
                        add("bwd", lambda: torch.autograd.grad(o, qkv, dout, retain_graph=True), 2.5 * fwd_flops)
                        add("fwdbwd", lambda: torch.autograd.grad(forward(), qkv, dout), 3.5 * fwd_flops)
                        del o
                except RuntimeError as e:  # a backend that refuses this shape/layout
                    print(f"peer: attention{suffix}@{variant} skipped: {str(e).splitlines()[0]}", file=sys.stderr)
        del qkv, dout
        torch.cuda.empty_cache()
    for B, H, S, D in BERT_SHAPES:
        shape = f"B{B}H{H}S{S}D{D}"
        qkv = torch.randn(B, S, 3, H, D, device="cuda", dtype=torch.bfloat16).requires_grad_(True)
        dout = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        mask = padding_mask(B, S)
        fwd_flops = 4.0 * B * H * S * S * D
        for tag, attn_mask, p in (("", None, 0.0), ("_mask", mask, 0.0), ("_mask_drop", mask, 0.1)):

            def forward(attn_mask=attn_mask, p=p):
                q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
                return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)

            for variant, ctx in backends():
                name = f"{tag}/{shape}@{variant}"
                try:
                    with ctx():
                        o = forward()
                        torch.autograd.grad(o, qkv, dout, retain_graph=True)
                        torch.cuda.synchronize()

                        def add(pas, fn, flops):
                            t = peer_util.time_us(fn, iters=it)
                            res.add(f"attention/{pas}{name}", t, tflops=round(flops / (t * 1e-6) / 1e12, 1))

                        with torch.no_grad():  # (the functional SDPA drops whenever dropout_p > 0)
                            add("fwd", forward, fwd_flops)
                        add("bwd", lambda: torch.autograd.grad(o, qkv, dout, retain_graph=True), 2.5 * fwd_flops)
                        add("fwdbwd", lambda: torch.autograd.grad(forward(), qkv, dout), 3.5 * fwd_flops)
                        del o
                except RuntimeError as e:
                    print(f"peer: attention{name} skipped: {str(e).splitlines()[0]}", file=sys.stderr)
        del qkv, dout, mask
        torch.cuda.empty_cache()
    res.write()


if __name__ == "__main__":
    main()
