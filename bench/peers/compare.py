#!/usr/bin/env python3
"""Joins our Google Benchmark JSON (counter median_us) with the PyTorch peers' JSON (time_us) by
benchmark name and prints a markdown table: ours, peer, and peer/ours (> 1 means we are faster).
A peer row named "<name>@<variant>" (e.g. "attention/fwd/B4H16S512D64@flash") is compared with our
"<name>", and also with an experiment's row of the same pass and shape where EXPERIMENTS names one
(our "attention_hopper/bwd/B4H16S2048D64" against the peer's "attention/bwd/B4H16S2048D64@cudnn"),
printed as a row of its own under the experiment's name.

With --rounds DIR..., each DIR holds one round's bench_*.json and *_peer.json (scripts/device-session.sh,
KERNEL_ROUNDS=N, alternates which side runs first): the table gives the median time of each side
over the rounds and every round's ratio, so a ratio is read against its own spread."""
import argparse
import glob
import json
import os
import statistics
import sys


# Prefix of a peer row -> prefixes of our experiments measured against the same peer rows.
EXPERIMENTS = {"attention/": ["attention_hopper/"]}


def our_names(base):
    """Our row names a peer row's base name is compared with: itself, then the experiments' names."""
    names = [base]
    for prefix, alts in EXPERIMENTS.items():
        if base.startswith(prefix):
            names += [alt + base[len(prefix):] for alt in alts]
    return names


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


def print_rounds(dirs):
    rounds = [(load_ours(sorted(glob.glob(os.path.join(d, "bench_*.json")))),
               load_peers(sorted(glob.glob(os.path.join(d, "*_peer.json"))))) for d in dirs]
    order = []  # peer row names in first-seen order
    for _, peers in rounds:
        for r in peers:
            if r["name"] not in order:
                order.append(r["name"])
    print(f"| benchmark | peer | ours (us, median of rounds) | peer (us) | peer/ours, each of {len(dirs)} rounds "
          "| lowest | median |")
    print("|---|---|---:|---:|---|---:|---:|")
    for name in order:
        peer_base, _, variant = name.partition("@")
        for base in our_names(peer_base):
            if base != peer_base and not any(base in ours for ours, _ in rounds):
                continue  # an experiment's row that was not run
            mine, theirs, ratios = [], [], []
            for ours, peers in rounds:
                t = next((r["time_us"] for r in peers if r["name"] == name), None)
                m = ours.get(base)
                if t is not None:
                    theirs.append(t)
                if m is not None:
                    mine.append(m)
                if t is not None and m is not None:
                    ratios.append(t / m)
            if not ratios:
                print(f"| {base} | {variant or 'torch'} | (not run) | "
                      f"{statistics.median(theirs) if theirs else float('nan'):.1f} | | | |")
                continue
            each = ", ".join(f"{x:.2f}" for x in ratios)
            print(f"| {base} | {variant or 'torch'} | {statistics.median(mine):.1f} | {statistics.median(theirs):.1f} | "
                  f"{each} | {min(ratios):.2f}x | {statistics.median(ratios):.2f}x |")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ours", nargs="*", default=[])
    ap.add_argument("--peers", nargs="*", default=[])
    ap.add_argument("--rounds", nargs="*", default=[], help="one folder per round (see above)")
    a = ap.parse_args()
    if a.rounds:
        missing = [d for d in a.rounds if not os.path.isdir(d)]
        if missing:
            print(f"compare: --rounds: not a folder: {', '.join(missing)}", file=sys.stderr)
            return 2
        print_rounds(a.rounds)
        return 0
    ours = load_ours(a.ours)
    peers = load_peers(a.peers)
    print("| benchmark | peer | ours (us) | peer (us) | peer/ours |")
    print("|---|---|---:|---:|---:|")
    for r in peers:
        peer_base, _, variant = r["name"].partition("@")
        for base in our_names(peer_base):
            mine = ours.get(base)
            if mine is None:
                if base == peer_base:
                    print(f"| {base} | {variant or 'torch'} | (not run) | {r['time_us']:.1f} | |")
                continue
            print(f"| {base} | {variant or 'torch'} | {mine:.1f} | {r['time_us']:.1f} | {r['time_us'] / mine:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
