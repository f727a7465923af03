#!/usr/bin/env python3
"""Compares two cutrain step folders (fp32 checkpoints of the CPU backend) tensor by tensor.

    compare_checkpoints.py A_STEP_FOLDER B_STEP_FOLDER [--lr LR --steps N]

Every tensor of model.safetensors and optimizer.safetensors within 1e-5 of A's by relative norm;
trainer_state.json byte-identical; config.json equal. The attention's key bias (the middle third
of in_proj_bias / attn.qkv.bias) has a gradient of zero in exact arithmetic (softmax does not see
it), so Adam's normalisation moves it by round-off: it is held to Adam's step bound instead
(|a - b| <= 2 lr steps) and left out of its tensor's norm; so are up to 1% of a tensor's params (at least one) whose
gradient is round-off for the same reason (a unit that sees nothing), each within that bound.
Pure Python (no numpy): exits 1 on a
difference, naming the file, the tensor and the relative error.
"""
import argparse
import json
import math
import struct
import sys
from array import array


def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            sys.exit(f"{path}: {name} is {t['dtype']}, expected F32 (the CPU backend's)")
        a = array("f")
        a.frombytes(data[t["data_offsets"][0]:t["data_offsets"][1]])
        out[name] = a
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    hidden = json.load(open(f"{args.a}/config.json"))["hidden_dim"]
    bound = 2 * args.lr * args.steps
    for f in ("model.safetensors", "optimizer.safetensors"):
        a, b = tensors(f"{args.a}/{f}"), tensors(f"{args.b}/{f}")
        if sorted(a) != sorted(b):
            sys.exit(f"{f}: different tensors: {sorted(set(a) ^ set(b))}")
        for k in a:
            if len(a[k]) != len(b[k]):
                sys.exit(f"{f}: {k}: {len(a[k])} vs {len(b[k])} elements")
            if k.endswith(("in_proj_bias", "qkv.bias", "c_attn.bias")):  # [q | k | v]: the key slice apart
                key = range(hidden, 2 * hidden)
                if f == "model.safetensors" and any(abs(a[k][i] - b[k][i]) > bound for i in key):
                    sys.exit(f"{f}: {k}: the key bias moved more than Adam's bound {bound}")
                for i in key:
                    a[k][i] = b[k][i] = 0.0
            den = math.sqrt(sum(x * x for x in a[k])) or 1.0
            # Single elements whose gradient is round-off (a unit that sees nothing) take Adam's
            # full step either way: up to 1% of a tensor's params (at least one) may differ by up
            # to Adam's bound; they are left out of the norm.
            far = [i for i, (x, y) in enumerate(zip(a[k], b[k])) if abs(x - y) > 1e-5 * den]
            if f == "model.safetensors" and len(far) <= max(1, len(a[k]) // 100):
                if any(abs(a[k][i] - b[k][i]) > bound for i in far):
                    sys.exit(f"{f}: {k}: an element moved more than Adam's bound {bound}")
                far = set(far)
                pairs = [(x, y) for i, (x, y) in enumerate(zip(a[k], b[k])) if i not in far]
            else:
                pairs = list(zip(a[k], b[k]))
            num = math.sqrt(sum((x - y) ** 2 for x, y in pairs))
            if num > 1e-5 * den:
                sys.exit(f"{f}: {k}: relative error {num / den:.3g} > 1e-5")
    if open(f"{args.a}/trainer_state.json").read() != open(f"{args.b}/trainer_state.json").read():
        sys.exit("trainer_state.json differs")
    if json.load(open(f"{args.a}/config.json")) != json.load(open(f"{args.b}/config.json")):
        sys.exit("config.json differs")


if __name__ == "__main__":
    main()
