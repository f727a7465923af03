#!/usr/bin/env python3
"""Summarises an `ncu --csv --section SpeedOfLight` capture (docs/profiling.md): one row per kernel
name with launches, total and mean duration, and the mean compute (SM) and memory throughput as %
of peak, sorted by total time, plus the capture's totals.
    python3 scripts/ncu_summary.py ncu.csv [--top N]"""
import argparse
import csv
import io
import sys
from collections import defaultdict


def rows(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')  # ncu prints its own lines (==PROF==) before the table
    if start < 0:
        sys.exit(f"ncu_summary: {path}: no CSV table (no line starting with \"ID\")")
    return list(csv.DictReader(io.StringIO(text[start:])))


def number(s):
    try:
        return float(s.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    per = defaultdict(lambda: {"ids": set(), "dur_us": 0.0, "sm": [], "mem": []})
    for r in rows(a.csv):
        name = r.get("Kernel Name", "?")
        k = per[name]
        k["ids"].add(r.get("ID"))
        metric, unit, value = r.get("Metric Name", ""), r.get("Metric Unit", ""), number(r.get("Metric Value"))
        if value is None:
            continue
        if metric == "Duration":
            scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
                     "s": 1e6, "second": 1e6}.get(unit)
            if scale is None:
                sys.exit(f"ncu_summary: unknown Duration unit {unit!r}")
            k["dur_us"] += value * scale
        elif metric == "Compute (SM) Throughput":
            k["sm"].append(value)
        elif metric == "Memory Throughput" and unit == "%":
            k["mem"].append(value)
    if not per:
        sys.exit("ncu_summary: the table has no kernels")
    total = sum(k["dur_us"] for k in per.values())
    launches = sum(len(k["ids"]) for k in per.values())
    print(f"{launches} kernel launches, {len(per)} kernels, {total / 1e3:.3f} ms of kernel time (serialized by ncu)")
    print(f"| kernel | launches | total ms | % | mean us | SM % | memory % |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    mean = lambda v: sum(v) / len(v) if v else float("nan")
    for name, k in sorted(per.items(), key=lambda kv: -kv[1]["dur_us"])[: a.top]:
        n = len(k["ids"])
        short = name if len(name) <= 70 else name[:67] + "..."
        print(f"| {short} | {n} | {k['dur_us'] / 1e3:.3f} | {100 * k['dur_us'] / total:.1f} | "
              f"{k['dur_us'] / n:.1f} | {mean(k['sm']):.1f} | {mean(k['mem']):.1f} |")


if __name__ == "__main__":
    main()
