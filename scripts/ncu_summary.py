#!/usr/bin/env python3
"""Summarises an `ncu --csv --section SpeedOfLight` capture (docs/profiling.md): one row per kernel
name with launches, total and mean duration, and the mean compute (SM) and memory throughput as %
of peak, sorted by total time, plus the capture's totals.
    python3 scripts/ncu_summary.py ncu.csv [--top N]
With --stalls, reads an `ncu --page details` report that profiled the metrics STALL_METRICS names
(scripts/ncu-attention-fwd.sh, scripts/ncu-cross-entropy.sh) and prints each warp stall reason's
cycles per issued instruction, largest first.
    python3 scripts/ncu_summary.py --stalls report.txt [--top N]
    python3 scripts/ncu_summary.py --print-stall-metrics   (the --metrics argument for ncu)"""
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


# The stall breakdown ncu's details page leaves out of the Warp State Statistics section (pass it
# to ncu's --metrics beside --set full).
STALL_METRICS = r"regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$"
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"


def stalls(text):
    """(reason, cycles per issued instruction) of each stall metric line of a details report,
    largest first."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].startswith(STALL_PREFIX) and words[0].endswith(STALL_SUFFIX):
            value = number(words[-1])
            if value is not None:
                out.append((words[0][len(STALL_PREFIX):-len(STALL_SUFFIX)], value))
    return sorted(out, key=lambda rv: -rv[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="?", help="the CSV capture, or with --stalls the details report")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--stalls", action="store_true", help="the stall reasons of a details report")
    ap.add_argument("--print-stall-metrics", action="store_true", help="print STALL_METRICS, for ncu's --metrics")
    a = ap.parse_args()
    if a.print_stall_metrics:
        print(STALL_METRICS)
        return
    if a.csv is None:
        ap.error("the report to read is missing")
    if a.stalls:
        found = stalls(open(a.csv, encoding="utf-8", errors="replace").read())
        if not found:
            sys.exit(f"ncu_summary: {a.csv}: no stall metrics (profile with --metrics '{STALL_METRICS}')")
        for reason, value in found[: a.top]:
            print(f"  stall {value:g} {reason}")
        return
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
