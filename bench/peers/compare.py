#!/usr/bin/env python3
"""Joins our Google Benchmark JSON (counter median_us) with the PyTorch peers' JSON (time_us) by
benchmark name and prints a markdown table: ours, peer, and peer/ours (> 1 means we are faster).
A peer row named "<name>@<variant>" (e.g. "attention/fwd/B4H16S512D64@flash") is compared with our
"<name>"."""
import argparse
import json
import sys


def load_ours(paths):
    ours = {}
    for p in paths:
        try:
            doc = json.load(open(p))
        except (OSError, ValueError) as e:
            print(f"compare: skipping {p}: {e}", file=sys.stderr)
            continue
        for b in doc.get("benchmarks", []):
            name = b["name"].split("/manual_time")[0].split("/iterations:")[0]
            if "median_us" in b:
                ours[name] = b["median_us"]
    return ours


def load_peers(paths):
    peers = []
    for p in paths:
        try:
            doc = json.load(open(p))
        except (OSError, ValueError) as e:
            print(f"compare: skipping {p}: {e}", file=sys.stderr)
            continue
        peers += doc.get("results", [])
    return peers


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ours", nargs="*", default=[])
    ap.add_argument("--peers", nargs="*", default=[])
    a = ap.parse_args()
    ours = load_ours(a.ours)
    peers = load_peers(a.peers)
    print("| benchmark | peer | ours (us) | peer (us) | peer/ours |")
    print("|---|---|---:|---:|---:|")
    for r in peers:
        base, _, variant = r["name"].partition("@")
        mine = ours.get(base)
        if mine is None:
            print(f"| {base} | {variant or 'torch'} | (not run) | {r['time_us']:.1f} | |")
            continue
        print(f"| {base} | {variant or 'torch'} | {mine:.1f} | {r['time_us']:.1f} | {r['time_us'] / mine:.2f}x |")


if __name__ == "__main__":
    main()
