#!/usr/bin/env python3
"""The report of scripts/quality-run.sh: from its results folder, a markdown loss table per model
(final and mean validation loss, mean training loss, each against baseline in %, the targets of
the compensated and stochastically rounded bf16 masters) and an SVG of the curves beside
DeepSpeed's published 7B loss curves. Plain Python (no matplotlib), so it runs on the device and
again here on fetched logs:

  scripts/quality_report.py --results DIR [--deepspeed_logs DIR] [--bench BENCH_K3_JSON] [--md FILE] [--svg FILE]

DIR holds <model>/<layout>.log (the `cutrain train` output) and <model>/<layout>_loss.csv, and
DIR/models.txt one line per model: "<name>|<description>". --bench: bench_k3's JSON with the
adamw/<layout>_comp/<n> rows (counter vs_plain: the compensated step over the plain one, measured
in the same call; target <= 1.05).
"""
import argparse
import csv
import math
import os
import re
import sys

from svg_plot import panel, smooth, write_svg_file

LAYOUTS = ["baseline", "bf16_master_wg", "bf16_full", "bf16_full_comp", "bf16_full_sr"]
LABELS = {
    "baseline": "baseline (fp32 master)",
    "bf16_master_wg": "bf16_master_wg",
    "bf16_full": "bf16_full",
    "bf16_full_comp": "bf16_full + compensation",
    "bf16_full_sr": "bf16_full + stochastic rounding",
}
# The targets against baseline: |delta| of the final and the mean validation loss.
TARGETS = {"bf16_full_comp": 0.3, "bf16_full_sr": 1.0}
COLORS = {
    "baseline": "#1f77b4",
    "bf16_master_wg": "#ff7f0e",
    "bf16_full": "#d62728",
    "bf16_full_comp": "#2ca02c",
    "bf16_full_sr": "#9467bd",
}
EVAL_RE = re.compile(r"Eval (before training|after step (\d+)): val_loss=([0-9.]+|nan|inf)")
LAYOUT_RE = re.compile(r"layout (\S+), (\d+) bytes/param")
SUMMARY_RE = re.compile(r"SUMMARY: .*avg_step_time=([0-9.]+)")


def read_losses(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]


def read_run(folder, layout):
    log = os.path.join(folder, layout + ".log")
    if not os.path.exists(log):
        return None
    text = open(log, errors="replace").read()
    run = {"evals": [], "train": read_losses(os.path.join(folder, layout + "_loss.csv"))}
    for m in EVAL_RE.finditer(text):
        step = 0 if m.group(1) == "before training" else int(m.group(2))
        run["evals"].append((step, float(m.group(3))))
    m = LAYOUT_RE.search(text)
    run["bytes"] = int(m.group(2)) if m else None
    m = SUMMARY_RE.search(text)
    run["step_time"] = float(m.group(1)) if m else None
    run["done"] = m is not None
    skip = re.search(r"^quality-run: skipped (.*)$", text, re.M)
    run["skipped"] = skip.group(1) if skip else None
    return run


def stats(run):
    """final and mean validation loss (evaluations after step 0), mean training loss."""
    ev = [v for s, v in run["evals"] if s > 0]
    tr = [v for _, v in run["train"]]
    return {
        "final": ev[-1] if ev else math.nan,
        "mean": sum(ev) / len(ev) if ev else math.nan,
        "train_mean": sum(tr) / len(tr) if tr else math.nan,
        "train_tail": sum(tr[-50:]) / len(tr[-50:]) if tr else math.nan,
    }


def pct(x, base):
    if not (math.isfinite(x) and math.isfinite(base)) or base == 0:
        return math.nan
    return 100.0 * (x / base - 1.0)


def fmt(x, spec=".4f"):
    return format(x, spec) if math.isfinite(x) else "n/a"


def fmt_pct(x):
    return f"{x:+.2f}%" if math.isfinite(x) else "n/a"


def model_table(name, desc, runs):
    out = [f"### {name}: {desc}", ""]
    out.append("| Layout | bytes/param | final val loss | vs baseline | mean val loss | vs baseline | "
               "mean train loss | vs baseline | step time | target |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    base = runs.get("baseline")
    bs = stats(base) if base and base["evals"] else None
    verdicts = []
    for layout in LAYOUTS:
        run = runs.get(layout)
        if run is None:
            continue
        if run["skipped"]:
            out.append(f"| {LABELS[layout]} | | skipped: {run['skipped']} | | | | | | | |")
            continue
        s = stats(run)
        d = {k: pct(s[k], bs[k]) if bs else math.nan for k in ("final", "mean", "train_mean")}
        target = ""
        if layout in TARGETS:
            t = TARGETS[layout]
            if math.isfinite(d["final"]) and math.isfinite(d["mean"]):
                ok = abs(d["final"]) <= t and abs(d["mean"]) <= t
                target = f"{'met' if ok else 'MISSED'} (within {t}%)"
                verdicts.append(f"{name}, {LABELS[layout]}: final {fmt_pct(d['final'])}, mean {fmt_pct(d['mean'])}: "
                                f"{target}")
            else:
                target = f"n/a (within {t}%)"
        elif layout == "baseline":
            target = "anchor"
        else:
            target = "reported"
        step = f"{1000 * run['step_time']:.2f} ms" if run["step_time"] else "n/a"
        note = "" if run["done"] else " (unfinished)"
        out.append(f"| {LABELS[layout]}{note} | {run['bytes'] or 'n/a'} | {fmt(s['final'])} | "
                   f"{'—' if layout == 'baseline' else fmt_pct(d['final'])} | {fmt(s['mean'])} | "
                   f"{'—' if layout == 'baseline' else fmt_pct(d['mean'])} | {fmt(s['train_mean'])} | "
                   f"{'—' if layout == 'baseline' else fmt_pct(d['train_mean'])} | {step} | {target} |")
    out.append("")
    return out, verdicts


def bench_lines(path):
    if not path:
        return []
    import json
    rows = [b for b in json.load(open(path)).get("benchmarks", []) if "vs_plain" in b]
    out = ["Optimizer step cost, compensated against plain bf16 master (same buffers, same call; target <= 1.05):", "",
           "| benchmark | time | vs plain | bytes/param moved | target |", "|---|---|---|---|---|"]
    for b in rows:
        r = b["vs_plain"]
        out.append(f"| {b['name']} | {b['real_time']:.1f} {b.get('time_unit', '')} | {r:.3f}x | "
                   f"{b.get('bytes_per_param', float('nan')):g} | {'met' if r <= 1.05 else 'MISSED'} |")
    if not rows:
        out.append("| (no adamw/*_comp rows in the file) | | | | |")
    return out + [""]


def deepspeed_curves(folder):
    if not folder:
        return {}
    curves = {}
    for n in ("baseline", "bf16_full"):
        c = read_losses(os.path.join(folder, f"{n}_loss.csv"))
        if c:
            curves[n] = c
    return curves


def deepspeed_lines(curves):
    if "baseline" not in curves or "bf16_full" not in curves:
        return ["DeepSpeed's published 7B curves: not found (pass --deepspeed_logs)", ""]
    b = [v for _, v in curves["baseline"]]
    f = [v for _, v in curves["bf16_full"]]
    return [
        "DeepSpeed's published 7B run (WikiText-103, 1000 steps, training loss per step, from its logs): "
        f"final {b[-1]:.4f} (baseline) vs {f[-1]:.4f} (bf16_full), {fmt_pct(pct(f[-1], b[-1]))}; "
        f"mean {sum(b) / len(b):.4f} vs {sum(f) / len(f):.4f}, {fmt_pct(pct(sum(f) / len(f), sum(b) / len(b)))}; "
        f"the mean from step 10 on (bf16_full's first 10 steps peak at {max(f[:10]):.1f}, step {f.index(max(f[:10]))}): "
        f"{sum(b[10:]) / len(b[10:]):.4f} vs {sum(f[10:]) / len(f[10:]):.4f}, "
        f"{fmt_pct(pct(sum(f[10:]) / len(f[10:]), sum(b[10:]) / len(b[10:])))}.",
        "",
    ]


# ---- SVG ----

def delta_pct(points, base):
    """points and base: smoothed (step, loss); the relative difference in % at the common steps,
    from a tenth of the run on (the first steps' spikes, e.g. DeepSpeed's bf16_full at 36.0 on
    step 3, would hide the rest)."""
    b = dict(base)
    start = 0.1 * max((s for s, _ in points), default=0)
    return [(s, 100.0 * (v / b[s] - 1.0)) for s, v in points if s >= start and s in b and b[s] > 0]


def write_svg(path, models, ds):
    """A row per model: validation loss, training loss (mean of 25 steps), and the training loss
    against baseline in % (mean of 50 steps) beside DeepSpeed's bf16_full against its baseline
    (dashed); a last row with DeepSpeed's published 7B curves."""
    w, h, mx, my = 400, 250, 70, 60
    rows = len(models) + (1 if ds else 0)
    width, height = 3 * (w + mx) + 20, rows * (h + my + 20) + 20
    out = []
    ds_delta = []
    if "baseline" in ds and "bf16_full" in ds:
        ds_delta = delta_pct(smooth(ds["bf16_full"], 50), smooth(ds["baseline"], 50))
    y = my - 20
    for name, desc, runs in models:
        live = [(l, r) for l, r in runs.items() if r and not r["skipped"]]
        val = [(LABELS[l], COLORS[l], r["evals"], False) for l, r in live]
        tr = [(LABELS[l], COLORS[l], smooth(r["train"]), False) for l, r in live]
        base = smooth(runs["baseline"]["train"], 50) if "baseline" in dict(live) else []
        dl = [(LABELS[l], COLORS[l], delta_pct(smooth(r["train"], 50), base), False) for l, r in live if l != "baseline"]
        if ds_delta:
            dl.append(("DeepSpeed 7B bf16_full", "#000000", ds_delta, True))
        out += panel(mx, y, w, h, f"{name}: validation loss", val, "val loss")
        out += panel(2 * mx + w, y, w, h, f"{name}: training loss (mean of 25 steps)", tr, "train loss")
        out += panel(3 * mx + 2 * w, y, w, h, f"{name}: training loss vs baseline (from 10%)", dl, "% (mean of 50 steps)",
                     clip_low=True)
        y += h + my + 20
    if ds:
        series = [("DeepSpeed 7B baseline", COLORS["baseline"], smooth(ds.get("baseline", [])), False),
                  ("DeepSpeed 7B bf16_full", COLORS["bf16_full"], smooth(ds.get("bf16_full", [])), True)]
        out += panel(mx, y, w, h, "DeepSpeed 7B (published): training loss (mean of 25)", series, "train loss")
        out += panel(2 * mx + w, y, w, h, "DeepSpeed 7B: bf16_full vs baseline (from 10%)", [series[1][:2] + (ds_delta, True)],
                     "% (mean of 50 steps)", clip_low=True)
    write_svg_file(path, width, height, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True)
    ap.add_argument("--deepspeed_logs", default="")
    ap.add_argument("--bench", default="")
    ap.add_argument("--md", default="")
    ap.add_argument("--svg", default="")
    a = ap.parse_args()
    listing = os.path.join(a.results, "models.txt")
    if not os.path.exists(listing):
        sys.exit(f"quality_report: {listing}: expected the list of models the run trained, found no file")
    models = []
    for line in open(listing):
        line = line.rstrip("\n")
        if not line:
            continue
        name, _, desc = line.partition("|")
        folder = os.path.join(a.results, name)
        runs = {l: read_run(folder, l) for l in LAYOUTS}
        models.append((name, desc, {l: r for l, r in runs.items() if r is not None}))
    ds = deepspeed_curves(a.deepspeed_logs)
    lines, verdicts = ["## BF16 master weights: loss by layout", ""], []
    for name, desc, runs in models:
        t, v = model_table(name, desc, runs)
        lines += t
        verdicts += v
    lines += deepspeed_lines(ds)
    lines += bench_lines(a.bench)
    if verdicts:
        lines += ["Targets:", ""] + [f"- {v}" for v in verdicts] + [""]
    text = "\n".join(lines)
    print(text)
    if a.md:
        tmp = a.md + ".tmp"
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, a.md)
    if a.svg:
        write_svg(a.svg, models, ds)
        print(f"Curves: {a.svg}")


if __name__ == "__main__":
    main()
