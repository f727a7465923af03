#!/usr/bin/env python3
"""The MoE ratio tables of scripts/device-session.sh's `moe` section, from bench_moe's JSON and
bench/peers/moe_peer.py's JSON of the same call:
  1. the layer (forward, forward+backward): ours against DeepSpeed's MoE layer and a plain PyTorch
     MoE, peer time / our time (target: >= 3 against DeepSpeed for fwd_bwd);
  2. the grouped expert GEMM against one dense GEMM of the same rows, dense time / grouped time
     (= the TFLOP/s ratio; target >= 0.8), beside the per-expert cuBLASLt loop's ratio and the
     slot layout's strided batch (balanced rows: R/E each), which the layer runs under dropping."""
import argparse
import json
import re
import sys


def load_ours(path):
    rows = {}
    for b in json.load(open(path)).get("benchmarks", []):
        name = b["name"].split("/iterations:")[0].split("/manual_time")[0]
        if "median_us" in b and not b.get("error_occurred"):
            rows[name] = b
    return rows


def load_peer(path):
    try:
        return {r["name"]: r["time_us"] for r in json.load(open(path)).get("results", [])}
    except (OSError, ValueError) as e:
        print(f"moe_table: no peer results ({e})", file=sys.stderr)
        return {}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ours", required=True)
    ap.add_argument("--peer", required=True)
    a = ap.parse_args()
    ours, peer = load_ours(a.ours), load_peer(a.peer)
    print("MoE layer (bf16, capacity factor 1, dropping): peer us / ours us, > 1 = cutrain faster; target fwd_bwd >= 3x DeepSpeed")
    print(f"{'row':50s} {'ours us':>10s} {'DS us':>10s} {'DS/ours':>8s} {'torch us':>10s} {'torch/ours':>10s} {'target':>7s}")
    for name, b in sorted(ours.items()):
        if not name.startswith("moe/"):
            continue
        us = b["median_us"]
        ds, pt = peer.get(name + "@deepspeed"), peer.get(name + "@torch")
        r_ds = ds / us if ds else None
        r_pt = pt / us if pt else None
        verdict = "" if r_ds is None or "fwd_bwd" not in name else ("met" if r_ds >= 3 else "MISSED")
        fmt = lambda v, w, p=1: f"{v:{w}.{p}f}" if v is not None else f"{'-':>{w}s}"
        print(f"{name:50s} {us:10.1f} {fmt(ds, 10)} {fmt(r_ds, 8, 2)} {fmt(pt, 10)} {fmt(r_pt, 10, 2)} {verdict:>7s}"
              f"  rows={b.get('rows', 0):.0f} dropped={b.get('dropped', 0):.0f} load={b.get('min_load', 0):.0f}..{b.get('max_load', 0):.0f}")
    print()
    print("Grouped expert GEMM vs one dense GEMM of the same rows: dense us / grouped us (= TFLOP/s ratio); target >= 0.8")
    print(f"{'row':52s} {'TFLOP/s':>8s} {'vs dense':>8s} {'loop vs dense':>13s} {'slots vs dense':>14s} {'target':>7s}")
    pat = re.compile(r"moe_gemm/grouped(_skew)?_(fwd|dgrad|wgrad)/E(\d+)_(R\d+_N\d+_K\d+)$")
    for name, b in sorted(ours.items()):
        m = pat.match(name)
        if not m:
            continue
        skew, d, e, rnk = m.groups()
        dense = ours.get(f"moe_gemm/dense_{d}/{rnk}")
        loop = ours.get(name.replace("/grouped", "/loop"))
        r = dense["median_us"] / b["median_us"] if dense else None
        rl = dense["median_us"] / loop["median_us"] if dense and loop else None
        slots = None if skew else ours.get(name.replace("/grouped", "/slots"))
        rs = dense["median_us"] / slots["median_us"] if dense and slots else None
        verdict = "" if r is None or skew else ("met" if r >= 0.8 else "MISSED")
        nan = float("nan")
        print(f"{name:52s} {b.get('TFLOP/s', 0):8.1f} {r if r is not None else nan:8.2f} "
              f"{rl if rl is not None else nan:13.2f} {rs if rs is not None else nan:14.2f} {verdict:>7s}"
              f"  fallbacks={b.get('fallbacks', 0):.0f}")


if __name__ == "__main__":
    main()
