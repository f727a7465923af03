#!/usr/bin/env python3
"""GPT-2 in plain PyTorch (no transformers), loaded from a Hugging Face-named safetensors file
(cutrain train --save_hf), and its mean validation loss over llm.c token-shard batches: batch i is
tokens [i*B*T, (i+1)*B*T + 1) of the shard, targets shifted by one (what llm.c's val loader and
cutrain's --eval_data read). The PyTorch side of the `llmc` device section's check.

  gpt2_torch_eval.py --weights M.safetensors --tokens val.bin --heads 12 [--batch 16 --seq 1024 --batches 8]
"""
import argparse
import json
import math
import struct

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        out[name.removeprefix("transformer.")] = t.float()
    return out


def gpt2_loss(w, idx, targets, heads, vocab):
    B, T = idx.shape
    x = w["wte.weight"][idx] + w["wpe.weight"][:T]
    C = x.shape[-1]
    L = 1 + max(int(k.split(".")[1]) for k in w if k.startswith("h."))
    for l in range(L):
        p = f"h.{l}."
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D: [in, out]
        q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in qkv.split(C, dim=2))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + a @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5)
        h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
    logits = x @ w["wte.weight"].t()  # tied head; wte has the real vocabulary's rows
    return F.cross_entropy(logits.view(-1, vocab), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=8)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    w = {k: v.to(dev) for k, v in load_safetensors(a.weights).items()}
    vocab = w["wte.weight"].shape[0]
    with open(a.tokens, "rb") as f:
        hdr = struct.unpack("256i", f.read(1024))
        assert hdr[0] == 20240520, f"{a.tokens}: not an llm.c token shard (magic {hdr[0]})"
        tok = torch.frombuffer(bytearray(f.read(2 * hdr[2])), dtype=torch.int16).to(torch.int64) & 0xFFFF
    n = a.batch * a.seq
    batches = min(a.batches, (len(tok) - 1) // n)
    torch.backends.cuda.matmul.allow_tf32 = False
    total = 0.0
    with torch.no_grad():
        for i in range(batches):
            chunk = tok[i * n: i * n + n + 1].to(dev)
            total += gpt2_loss(w, chunk[:-1].view(a.batch, a.seq), chunk[1:].view(a.batch, a.seq), a.heads, vocab).item()
    loss = total / batches
    print(f"torch val loss {loss:.6f} ({batches} batches of {a.batch} x {a.seq}, fp32, {dev}); ppl {math.exp(loss):.2f}")


if __name__ == "__main__":
    main()
