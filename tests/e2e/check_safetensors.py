#!/usr/bin/env python3
"""Reads a cutrain-written safetensors file with the Python `safetensors` package and checks it.

Run test_safetensors first (Safetensors.WritesKnownFileForPythonCheck writes the file and
known.expected.json into $CUTRAIN_E2E_DIR, default <tmp>/cutrain_e2e), then:

    python3 tests/e2e/check_safetensors.py [FILE.safetensors] [--expected FILE.expected.json]

Prints each tensor's name, dtype, shape and FNV-1a 64 checksum of its raw bytes; exits 1 when any of
them, the first values or the metadata differ from the expectation, 2 when the package is missing.
"""
import argparse
import json
import os
import sys
import tempfile

FNV_OFFSET, FNV_PRIME = 1469598103934665603, 1099511628211


def fnv1a64(data: bytes) -> int:
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def load_with_torch(path):
    import torch  # noqa: F401  (the GPU machine has it; needed for BF16)
    from safetensors import safe_open

    names = {
        torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
        torch.int32: "I32", torch.uint8: "U8", torch.int64: "I64",
    }
    if hasattr(torch, "uint16"):
        names[torch.uint16] = "U16"
    out = {}
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata() or {}
        for name in f.keys():
            t = f.get_tensor(name).contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            first = t.reshape(-1)[:4]
            first = first.float().tolist() if t.is_floating_point() else first.tolist()
            out[name] = {"dtype": names.get(t.dtype, str(t.dtype)), "shape": list(t.shape), "raw": raw, "first": first}
    return metadata, out


def main() -> int:
    default_dir = os.environ.get("CUTRAIN_E2E_DIR") or os.path.join(tempfile.gettempdir(), "cutrain_e2e")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default=os.path.join(default_dir, "known.safetensors"))
    ap.add_argument("--expected", default=None, help="expectation JSON (default: <file stem>.expected.json)")
    args = ap.parse_args()
    expected_path = args.expected or os.path.splitext(args.file)[0] + ".expected.json"
    try:
        metadata, tensors = load_with_torch(args.file)
    except ImportError as e:
        print(f"check_safetensors: needs the `safetensors` and `torch` packages: {e}", file=sys.stderr)
        return 2

    print(f"{args.file}: {len(tensors)} tensors, metadata {metadata}")
    for name in sorted(tensors):
        t = tensors[name]
        print(f"  {name:12s} {t['dtype']:5s} {str(t['shape']):10s} fnv1a64={fnv1a64(t['raw'])} first={t['first']}")

    if not os.path.exists(expected_path):
        print(f"no expectation file {expected_path}: printed only")
        return 0
    with open(expected_path) as f:
        want = json.load(f)
    problems = []
    if metadata != want["metadata"]:
        problems.append(f"metadata {metadata} != expected {want['metadata']}")
    if set(tensors) != set(want["tensors"]):
        problems.append(f"tensor names {sorted(tensors)} != expected {sorted(want['tensors'])}")
    for name, w in want["tensors"].items():
        t = tensors.get(name)
        if t is None:
            continue
        if t["dtype"] != w["dtype"]:
            problems.append(f"{name}: dtype {t['dtype']} != {w['dtype']}")
        if t["shape"] != w["shape"]:
            problems.append(f"{name}: shape {t['shape']} != {w['shape']}")
        if str(fnv1a64(t["raw"])) != w["fnv1a64"]:
            problems.append(f"{name}: checksum {fnv1a64(t['raw'])} != {w['fnv1a64']}")
        if [float(x) for x in t["first"]] != [float(x) for x in w["first"]]:
            problems.append(f"{name}: first values {t['first']} != {w['first']}")
    for p in problems:
        print("MISMATCH " + p)
    print("check_safetensors: " + ("FAILED" if problems else "OK (matches " + expected_path + ")"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
