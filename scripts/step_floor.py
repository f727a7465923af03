#!/usr/bin/env python3
"""Where a training step's time goes against its floor, from a timing report's JSON
(`cutrain train --timing_report FILE.json`).

Each leaf region (a region with no timed children, layers folded: `regions_by_kind`) gets a floor
from the cost the report already carries: its FLOPs at the measured cuBLASLt bf16 GEMM peak, or
its bytes at the measured copy bandwidth, whichever is longer (the same two peaks the report
measured in the same process). The table gives each leaf's time per step, its floor, the excess
over the floor and that excess's share of the step's whole excess, largest first; the time no leaf
covers (launch gaps, host work between regions, untimed kernels) is its own row. Leaves without a
cost model (no FLOPs, no bytes) are listed with their time as excess.

  scripts/step_floor.py REPORT.json [--top N] [--markdown]
"""
import argparse
import json
import sys


def leaves(report):
    """The leaf rows of the folded region tree (a row none of whose names is another's prefix + '/')."""
    rows = report.get("regions_by_kind", [])
    names = [r["name"] for r in rows]
    return [r for r in rows if not any(n.startswith(r["name"] + "/") for n in names)]


def step_ms(report):
    step = report.get("step_region", "step")
    return next((r["ms_per_step"] for r in report.get("regions_by_kind", []) if r["name"] == step), None)


def floors(report):
    """Rows (name, ms/step, floor ms or None, bound) for every leaf, plus the uncovered time."""
    peaks = report["peaks"]
    gemm = peaks["gemm_tflops_measured"] * 1e12
    copy = peaks["copy_gbps"] * 1e9
    out = []
    for r in leaves(report):
        ms = r["ms_per_step"]
        flops = r.get("tflops", 0.0) * 1e12 * ms * 1e-3
        byts = r.get("gbps", 0.0) * 1e9 * ms * 1e-3
        f_c = flops / gemm * 1e3 if flops > 0 else 0.0
        f_m = byts / copy * 1e3 if byts > 0 else 0.0
        if f_c == 0.0 and f_m == 0.0:
            out.append((r["name"], ms, None, "-"))
        else:
            out.append((r["name"], ms, max(f_c, f_m), "compute" if f_c >= f_m else "memory"))
    total = step_ms(report)
    covered = sum(ms for _, ms, _, _ in out)
    if total is not None:
        out.append(("(not in any leaf: gaps, host, untimed)", total - covered, 0.0, "-"))
    return out, total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="timing report JSON (--timing_report FILE.json)")
    ap.add_argument("--top", type=int, default=0, help="only the N rows of largest excess (0: all)")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table")
    a = ap.parse_args()
    try:
        rep = json.load(open(a.report))
        rows, total = floors(rep)
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"step_floor: {a.report}: not a timing report JSON ({e.__class__.__name__}: {e})")
    if total is None:
        sys.exit(f"step_floor: {a.report}: no '{rep.get('step_region', 'step')}' region to take the step time from")
    excess = [(n, ms, f, b, ms - (f or 0.0)) for n, ms, f, b in rows]
    all_excess = sum(e for *_, e in excess)
    floor_sum = sum(f or 0.0 for _, _, f, _, _ in excess)
    excess.sort(key=lambda x: -x[4])
    if a.top:
        excess = excess[: a.top]
    print(f"step {total:.3f} ms; sum of the leaves' floors {floor_sum:.3f} ms ({100 * floor_sum / total:.1f}% of the "
          f"step); excess {all_excess:.3f} ms (peaks: GEMM {rep['peaks']['gemm_tflops_measured']:.1f} TFLOP/s, "
          f"copy {rep['peaks']['copy_gbps']:.0f} GB/s, measured in the same run)")
    fmt = "| {} | {:.3f} | {} | {} | {:.3f} | {:.1f}% |" if a.markdown else "  {:52s} {:8.3f} {:>8s} {:>8s} {:8.3f} {:6.1f}%"
    if a.markdown:
        print("| region | ms/step | floor ms | bound | excess ms | of excess |\n|---|---:|---:|---|---:|---:|")
    else:
        print(f"  {'region':52s} {'ms/step':>8s} {'floor':>8s} {'bound':>8s} {'excess':>8s} {'share':>7s}")
    for n, ms, f, b, e in excess:
        print(fmt.format(n, ms, "-" if f is None else f"{f:.3f}", b, e, 100 * e / all_excess if all_excess else 0.0))


if __name__ == "__main__":
    main()
