#!/usr/bin/env python3
"""Issue #21's quality figures: validation loss against wall-clock time for the baseline, the
vocabulary-rarity curriculum, random-LTD and both composed (and the sequence-length warm-up where
its config exists), trained on the same shards with the same seed, model, optimizer and lr
schedule, with validation every --eval_interval steps; then a table, the verdict of the target
"the composed run reaches the baseline's best validation loss in <= 80% of its wall-clock time",
and the curves (SVG always, PNG where matplotlib or an SVG converter is there).

    scripts/data_efficiency_quality.py --bin build/gpu/tools/cutrain [--shape gpt2_small|bf16_example|tiny]
        [--device cuda|cpu] [--variants LIST] [--steps N] [--warmup N] [--lr LR] [--eval_interval N]
        [--eval_steps N] [--seed N] [--curriculum_fraction F] [--ltd_fraction F] [--ltd_min K]
        [--composed_curriculum vocabularyrarity|seqlen|both] [--data DIR] [--corpus PATH ...] [--text_bytes N] [--budget SECONDS] [--out DIR]
    scripts/data_efficiency_quality.py --report DIR     (the table and plots again from a results folder)

Variants (--variants, comma-separated; default every one whose config is in configs/):
  baseline    no data efficiency
  curriculum  the vocabularyrarity curriculum (configs/curriculum_vocabularyrarity.json's block): percentile
              1 -> 100, fixed_root of degree 2 over --curriculum_fraction of the steps; its index built
              here by `cutrain analyze-data` from the training shards
  seqlen      the sequence-length warm-up (configs/curriculum_seqlen_gpt.json's seqlen_truncate block):
              fixed_linear from S/16 (at least 8) to S over --curriculum_fraction of the steps
  random_ltd  random-LTD (configs/curriculum_random_ltd.json's data_routing block) on blocks 1..L-2,
              kept tokens fixed_linear from --ltd_min to S over --ltd_fraction of the steps
  composed    curriculum + random-LTD, configs/curriculum_random_ltd.json's whole block; its curriculum by
              --composed_curriculum: vocabularyrarity (the default, that block's), seqlen (the seqlen variant's
              warm-up in its place: random-LTD's kept count then applies to each step's length, min(kept, L)),
              or both (the two curricula and random-LTD, Megatron-DeepSpeed's full composition)
The fractions' defaults follow Megatron-DeepSpeed's composed GPT-3 1.3B recipe (cl_1st_total_step
110000 and ltd_step 200000 of a run of about 286k steps; ltd_start 128). Every variant takes the
optimizer, precision and clipping of configs/curriculum_random_ltd.json and one WarmupCosineLR
(--warmup steps, cosine to 0.1 at --steps): a step-indexed schedule for all, so the lr is not
a variable (DeepSpeed's recipe decays by tokens; `--lr_decay_tokens` is not used here).

Time, from each run's --metrics_file (train/train_loop.cpp): "steps" = the sum of step_time_s up
to the evaluation (the steps alone: no evaluation, data draw or logging); "wall" = elapsed_s
there (the loop's clock from its first step: every step, evaluation, draw and log line so far).
The verdict uses the steps clock: evaluation runs the whole sequence on the same held-out batches
in every variant, a fixed cost set by --eval_interval that would pull every ratio toward 1; the
wall clock's ratio is in the table beside it. "Reached" is the first evaluation at or below the
baseline's best validation loss (no interpolation between evaluations, so the time is rounded up
to the next evaluation); the baseline's own time is that of its best evaluation.

Data: WikiText-2 valid + test (10% held out) from --data, or --corpus: text files, folders (every
file under them) or .tar.xz / .tar.gz archives of text files (scripts/corpus-linux-doc.sh makes
one from Debian's linux-doc package), their files put in an order fixed by a hash of their names
(so the 10% held out for validation mixes topics) and tokenized by `cutrain prepare-data`.
--budget: a variant is started only while the time its predecessor took still fits (the others
are listed as skipped); the order is baseline, composed, random_ltd, curriculum, seqlen, so the
verdict's two runs come first. --shape tiny on --device cpu checks the tool (the e2e test); it
decides no target.
"""
import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svg_plot import panel, write_svg_file  # noqa: E402
from wikitext_shards import corpus_inputs, prepare_shards, shard_tokens, wikitext_inputs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "base": "configs/curriculum_random_ltd.json",
    "curriculum": "configs/curriculum_vocabularyrarity.json",
    "seqlen": "configs/curriculum_seqlen_gpt.json",
    "random_ltd": "configs/curriculum_random_ltd.json",
    "composed": "configs/curriculum_random_ltd.json",
}
ORDER = ["baseline", "composed", "random_ltd", "curriculum", "seqlen"]  # run order (the verdict's pair first)
SHOWN = ["baseline", "curriculum", "seqlen", "random_ltd", "composed"]  # table and legend order
LABELS = {
    "baseline": "baseline",
    "curriculum": "curriculum (vocabularyrarity)",
    "seqlen": "curriculum (seqlen warm-up)",
    "random_ltd": "random-LTD",
    "composed": "curriculum + random-LTD",
}
COLORS = {"baseline": "#1f77b4", "curriculum": "#2ca02c", "seqlen": "#8c564b", "random_ltd": "#ff7f0e",
          "composed": "#d62728"}
TARGET = 0.8  # the issue's: composed reaches the baseline's best in <= 80% of its time
FAILED = "data_efficiency_quality: this run failed"  # the line a failed run's log ends with

# name: (description, flags, layers, batch, seq)
SHAPES = {
    "gpt2_small": ("GPT-2 small (llm.c's GPT-2: h 768, 12 blocks, 12 heads), batch 8 x seq 1024",
                   ["--model", "gpt2", "--hidden_dim", "768", "--num_layers", "12", "--num_heads", "12",
                    "--vocab_size", "50257"], 12, 8, 1024),
    "bf16_example": ("the BF16 example's model (h 1024, 12 blocks, 16 heads, causal), batch 4 x seq 512",
                     ["--hidden_dim", "1024", "--num_layers", "12", "--num_heads", "16", "--vocab_size", "50257",
                      "--pad_vocab"], 12, 4, 512),
    "tiny": ("tiny GPT-2 (h 128, 4 blocks, 2 heads), batch 2 x seq 32",
             ["--model", "gpt2", "--hidden_dim", "128", "--num_layers", "4", "--num_heads", "2", "--vocab_size", "50257"],
             4, 2, 32),
}


def die(msg):
    sys.stderr.write(f"data_efficiency_quality: {msg}\n")
    raise SystemExit(2)


def available_variants():
    return [v for v in ORDER if v == "baseline" or os.path.exists(os.path.join(ROOT, CONFIGS[v]))]


# ---------------------------------------------------------------- data
def find_data(arg):
    for d in ([arg] if arg else [os.environ.get("CUTRAIN_DATA_DIR", ""), os.path.join(ROOT, "../shared/data"),
                                 os.path.join(ROOT, ".devdata")]):
        if d and os.path.exists(os.path.join(d, "gpt2", "encoder.json")):
            return d
    die(f"--data: expected gpt2/encoder.json (and wikitext-2/ without --corpus) under '{arg or '(none found)'}'")


def prepare(args, data, out):
    ddir = os.path.join(out, "data")
    os.makedirs(ddir, exist_ok=True)
    for f in glob.glob(os.path.join(ddir, "*.bin")):
        os.remove(f)
    if args.corpus:
        inputs, name = corpus_inputs(args.corpus, ddir, args.text_bytes, die)
    else:
        inputs = wikitext_inputs(data, ddir, args.text_bytes)
        name = "WikiText-2 valid+test"
    stdout = prepare_shards(args.bin, inputs, data, os.path.join(ddir, "de"), die)
    return os.path.join(ddir, "de"), f"{name}, 10% of its documents held out: {shard_tokens(stdout)}"


def analyze(args, shards, seq, out):
    idx = os.path.join(out, "rarity_index.json")
    cmd = [args.bin, "analyze-data", "--data", shards + "_train_*.bin", "--seq_length", str(seq), "--metric",
           "vocabularyrarity", "--output", idx]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        die("analyze-data failed:\n" + p.stdout[-2000:] + p.stderr[-2000:])
    return idx


# ---------------------------------------------------------------- configs
def schedules(args, layers, seq):
    """The variants' schedule parameters, scaled to the run."""
    cl_steps = max(1, round(args.curriculum_fraction * args.steps))
    ltd_steps = max(1, round(args.ltd_fraction * args.steps))
    ltd_min = args.ltd_min if args.ltd_min else min(128, seq // 4)
    per_step = min(16, ltd_min)
    ltd_min -= ltd_min % per_step
    sl_step = max(1, min(8, seq // 16))
    sl_min = max(8, seq // 16)  # at least 8: the first lengths of a tiny run stay real attention shapes
    sl_min -= sl_min % sl_step
    return {"cl_steps": cl_steps, "ltd_steps": ltd_steps, "ltd_min": ltd_min, "ltd_per_step": per_step,
            "ltd_layers": list(range(1, layers - 1)), "sl_min": sl_min, "sl_step": sl_step}


def composed_uses(args_or_meta, metric):
    """Whether the composed variant's curriculum has `metric` (vocabularyrarity or seqlen)."""
    c = args_or_meta.get("composed_curriculum", "vocabularyrarity") if isinstance(args_or_meta, dict) \
        else args_or_meta.composed_curriculum
    return c in (metric, "both")


def label(meta, v):
    if v != "composed":
        return LABELS[v]
    c = meta.get("composed_curriculum", "vocabularyrarity")
    return {"vocabularyrarity": LABELS[v], "seqlen": "seqlen warm-up + random-LTD",
            "both": "curriculum + seqlen warm-up + random-LTD"}[c]


def describe_schedules(s, seq, layers, variants, composed="vocabularyrarity"):
    out = []
    if "curriculum" in variants or ("composed" in variants and composed != "seqlen"):
        out.append(f"curriculum: vocabularyrarity, percentile 1 -> 100, fixed_root (degree 2) over {s['cl_steps']} steps")
    if "seqlen" in variants or ("composed" in variants and composed != "vocabularyrarity"):
        out.append(f"seqlen: seqlen_truncate {s['sl_min']} -> {seq}, fixed_linear over {s['cl_steps']} steps, "
                   f"difficulty_step {s['sl_step']}")
    if "random_ltd" in variants or "composed" in variants:
        out.append(f"random-LTD: blocks 1..{layers - 2} of {layers}, kept {s['ltd_min']} -> {seq} tokens, fixed_linear "
                   f"over {s['ltd_steps']} steps, seq_per_step {s['ltd_per_step']}")
    if "composed" in variants:
        out.append(f"composed: {composed} curriculum + random-LTD" +
                   (" (the kept count of each step is min(kept, its length))" if composed != "vocabularyrarity" else ""))
    return out


def write_config(args, variant, out, batch, seq, layers, index, s):
    base = json.load(open(os.path.join(ROOT, CONFIGS["base"])))
    c = {k: v for k, v in base.items() if k != "data_efficiency"}
    c["train_micro_batch_size_per_gpu"] = batch  # the config's micro batch wins over --batch_size
    c["scheduler"] = {"type": "WarmupCosineLR", "params": {"total_num_steps": args.steps, "warmup_num_steps": args.warmup,
                      "warmup_type": "linear", "warmup_min_ratio": 0.0, "cos_min_ratio": 0.1}}
    if variant != "baseline":
        de = json.load(open(os.path.join(ROOT, CONFIGS[variant])))["data_efficiency"]
        de = {"enabled": True, "seed": de.get("seed", 1234), **{k: de[k] for k in ("data_sampling", "data_routing") if k in de}}
        metrics = de["data_sampling"]["curriculum_learning"]["curriculum_metrics"] if "data_sampling" in de else {}
        if variant == "composed" and composed_uses(args, "seqlen"):
            seqlen_de = json.load(open(os.path.join(ROOT, CONFIGS["seqlen"])))["data_efficiency"]
            metrics["seqlen_truncate"] = seqlen_de["data_sampling"]["curriculum_learning"]["curriculum_metrics"]["seqlen_truncate"]
        if variant == "composed" and not composed_uses(args, "vocabularyrarity"):
            metrics.pop("vocabularyrarity")
        if variant == "curriculum" or (variant == "composed" and composed_uses(args, "vocabularyrarity")):
            m = metrics["vocabularyrarity"]
            m["index_to_sample_path"] = m["index_to_metric_path"] = index
            m["schedule_config"]["total_curriculum_step"] = s["cl_steps"]
        if variant == "seqlen" or (variant == "composed" and composed_uses(args, "seqlen")):
            m = metrics["seqlen_truncate"]
            m.update({"min_difficulty": s["sl_min"], "max_difficulty": seq})
            m["schedule_config"].update({"total_curriculum_step": s["cl_steps"], "difficulty_step": s["sl_step"]})
        if variant in ("random_ltd", "composed"):
            r = de["data_routing"]["random_ltd"]
            r.update({"total_layer_num": layers, "random_ltd_layer_num": len(s["ltd_layers"]),
                      "random_ltd_layer_id": s["ltd_layers"], "model_type": "decoder"})
            r["random_ltd_schedule"].update({"min_value": s["ltd_min"], "max_value": seq})
            r["random_ltd_schedule"]["schedule_config"] = {"require_steps": s["ltd_steps"], "seq_per_step": s["ltd_per_step"]}
        if variant == "curriculum":
            de.pop("data_routing", None)
        if variant == "random_ltd":
            de.pop("data_sampling", None)
        c["data_efficiency"] = de
    path = os.path.join(out, "configs", variant + ".json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(c, f, indent=2)
    os.replace(path + ".tmp", path)
    return path


# ---------------------------------------------------------------- runs
def train(args, cfg, shards, flags, batch, seq, name, out):
    log = os.path.join(out, name + ".log")
    metrics = os.path.join(out, name + "_metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [args.bin, "train", "--deepspeed_config", cfg, "--device", args.device, *flags, "--batch_size", str(batch),
           "--seq_length", str(seq), "--use_real_data", "--data", shards + "_train_*.bin", "--eval_data",
           shards + "_val_*.bin", "--num_steps", str(args.steps), "--warmup_steps", str(min(10, args.steps - 1)),
           "--learning_rate", str(args.lr), "--seed", str(args.seed), "--eval_interval", str(args.eval_interval),
           "--eval_steps", str(args.eval_steps), "--log_interval", str(args.eval_interval), "--metrics_file", metrics]
    t0 = time.time()
    with open(log, "w") as f:
        f.write("# " + " ".join(cmd) + "\n")
        f.flush()
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        sys.stderr.write(f"data_efficiency_quality: {name} failed (rc {p.returncode}); tail of {log}:\n"
                         + open(log).read()[-2000:] + "\n")
        with open(log, "a") as f:
            f.write(f"\n{FAILED} (rc {p.returncode})\n")
    return time.time() - t0, p.returncode


def read_run(out, name, batch, seq, layers):
    """The evaluation points (step, steps clock, wall clock, val loss) and the totals of a run."""
    log = os.path.join(out, name + ".log")
    text = open(log, errors="replace").read()
    if text.startswith("skipped"):
        return {"skipped": text.strip()}
    mpath = os.path.join(out, name + "_metrics.jsonl")
    rows = []
    for line in open(mpath) if os.path.exists(mpath) else []:
        try:
            rows.append(json.loads(line))
        except ValueError:  # the last line of a run that was killed while writing it
            break
    if FAILED in text:
        return {"skipped": "failed" + text.split(FAILED)[1].split("\n")[0] + f": see {name}.log"}
    if not rows:
        return {"skipped": f"no metrics (the run did not start its steps): see {name}.log"}
    before = next((l for l in text.splitlines() if "Eval before training: val_loss=" in l), None)
    points = []
    if before:
        points.append({"step": -1, "t_steps": 0.0, "t_wall": 0.0, "val": float(before.split("val_loss=")[1].split(",")[0])})
    t = 0.0
    for r in rows:
        t += r["step_time_s"]
        if "val_loss" in r:
            points.append({"step": r["step"], "t_steps": t, "t_wall": r["elapsed_s"], "val": r["val_loss"]})
    last = rows[-1]
    tokens = last.get("consumed_tokens", len(rows) * batch * seq)
    layer_tokens = last.get("consumed_layer_tokens", tokens * layers)
    evals = [p for p in points if p["step"] >= 0]
    return {"points": points, "steps": len(rows), "unfinished": "FINAL RESULTS" not in text, "t_steps": t, "t_wall": last["elapsed_s"],
            "eval_s": sum(r.get("eval_time_s", 0.0) for r in rows), "tokens": tokens, "layer_tokens": layer_tokens,
            "final": evals[-1]["val"] if evals else math.nan, "best": min(p["val"] for p in evals) if evals else math.nan}


def first_reach(run, target):
    """The first evaluation (after training began) at or below target, or None."""
    return next((p for p in run["points"] if p["step"] >= 0 and p["val"] <= target), None)


# ---------------------------------------------------------------- report
def fmt(x, spec=".4f"):
    return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def report(meta, runs):
    lines = [f"## Data efficiency: validation loss against wall-clock time", "",
             f"{meta['shape']}; {meta['corpus']}; {meta['steps']} steps, lr {meta['lr']}, {meta['warmup']} warm-up steps + "
             f"cosine to 0.1, seed {meta['seed']}, validation every {meta['eval_interval']} steps on the first "
             f"{meta['eval_steps']} batches of the held-out shards (fewer where they hold fewer), {meta['device']}.", ""]
    lines += [f"- {d}" for d in meta["schedules"]] + [""]
    lines += ["| variant | final val loss | best val loss | time, steps (s) | time, wall (s) | tokens | layer tokens | "
              "reaches baseline's best at step | time to it, steps (s) | vs baseline | time to it, wall (s) | vs baseline |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = runs.get("baseline")
    have_base = base is not None and "skipped" not in base and math.isfinite(base["best"])
    target = base["best"] if have_base else math.nan
    bt = first_reach(base, target) if have_base else None
    verdict = None
    for v in meta["variants"]:
        r = runs.get(v)
        if r is None:
            continue
        if "skipped" in r:
            lines.append(f"| {label(meta, v)} | {r['skipped']} | | | | | | | | | | |")
            if v == "composed":
                verdict = f"- Composed reaches the baseline's best validation loss in <= 80% of its time: n/a (composed {r['skipped']})"
            continue
        reach = first_reach(r, target) if have_base else None
        if reach and bt:
            rs, rw = reach["t_steps"] / bt["t_steps"], reach["t_wall"] / bt["t_wall"]
            cells = [str(reach["step"]), fmt(reach["t_steps"], ".1f"), f"{rs:.3f}", fmt(reach["t_wall"], ".1f"), f"{rw:.3f}"]
        else:
            rs = None
            cells = ["not reached" if have_base else "n/a (no baseline)", "", "", "", ""]
        lines.append(f"| {label(meta, v)}{' (unfinished)' if r['unfinished'] else ''} | {fmt(r['final'])} | {fmt(r['best'])} | {fmt(r['t_steps'], '.1f')} | "
                     f"{fmt(r['t_wall'], '.1f')} | {r['tokens']:,} | {r['layer_tokens']:,} | " + " | ".join(cells) + " |")
        if v == "composed":
            if not have_base:
                verdict = "- Composed reaches the baseline's best validation loss in <= 80% of its time: n/a (no baseline run)"
            elif rs is None:
                verdict = (f"- Composed reaches the baseline's best validation loss ({target:.4f}) in <= 80% of its time: "
                           f"not reached in {r['steps']} steps (best {r['best']:.4f}): MISSED")
            else:
                verdict = (f"- Composed reaches the baseline's best validation loss ({target:.4f}) in <= 80% of its time: "
                           f"{reach['t_steps']:.1f} s against {bt['t_steps']:.1f} s of steps = {rs:.3f} "
                           f"(wall clock with evaluation: {reach['t_wall'] / bt['t_wall']:.3f}): "
                           f"{'met' if rs <= TARGET else 'MISSED'}")
    lines += ["", "Time: steps = the sum of the steps' own time up to the evaluation (the verdict's clock); wall = "
              "the loop's clock from its first step, evaluations, data draws and logging included. A variant reaches "
              "the baseline's best at its first evaluation at or below it (no interpolation).", ""]
    if verdict:
        lines.append(verdict)
    if meta["shape_name"] == "tiny":
        lines.append("- (tiny shape: a check of the tool, not a figure of the issue)")
    return "\n".join(lines) + "\n"


def write_plots(meta, runs, out):
    """SVG always (scripts/svg_plot.py); PNG through matplotlib, else an SVG converter on the PATH."""
    live = [(v, runs[v]) for v in meta["variants"] if v in runs and "skipped" not in runs[v]]
    base = runs.get("baseline")
    best = base["best"] if base and "skipped" not in base else None
    w, h, mx, my = 460, 300, 70, 50
    parts = []
    # From the first evaluation after training began: the loss before it (about ln(vocab)) would
    # flatten the rest.
    for i, (key, xlabel) in enumerate((("t_steps", "seconds of steps"), ("t_wall", "seconds, wall clock (evaluation in)"))):
        series = [(label(meta, v), COLORS[v], [(p[key], p["val"]) for p in r["points"] if p["step"] >= 0], False)
                  for v, r in live]
        xs = [x for _, _, ps, _ in series for x, _ in ps]
        if best is not None and xs:
            series.append(("baseline's best", "#777777", [(min(xs), best), (max(xs), best)], True))
        title = "validation loss vs " + ("the steps' time (the verdict's clock)" if key == "t_steps" else "wall clock")
        parts += panel(mx + i * (w + mx), my, w, h, title, series, "val loss", xlabel=xlabel)
    svg = os.path.join(out, "data_efficiency.svg")
    write_svg_file(svg, 2 * (w + mx) + 20, h + 2 * my + 10, parts)
    png = os.path.join(out, "data_efficiency.png")
    if os.path.exists(png):
        os.remove(png)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
        for ax, key, xl in ((axes[0], "t_steps", "seconds of steps (the verdict's clock)"),
                            (axes[1], "t_wall", "seconds, wall clock (evaluation in)")):
            for v, r in live:
                ps = [p for p in r["points"] if p["step"] >= 0]
                ax.plot([p[key] for p in ps], [p["val"] for p in ps], marker=".", color=COLORS[v], label=label(meta, v))
            if best is not None:
                ax.axhline(best, color="#777777", linestyle="--", linewidth=1, label="baseline's best")
            ax.set_xlabel(xl)
            ax.set_ylabel("validation loss")
            ax.grid(alpha=0.3)
            ax.legend()
        fig.suptitle(meta["shape"])
        fig.tight_layout()
        fig.savefig(png, dpi=110)
        return svg, png, "matplotlib"
    except ImportError:
        pass
    for tool in (["rsvg-convert", "-o", png, svg], ["convert", svg, png]):
        if shutil.which(tool[0]):
            if subprocess.run(tool, capture_output=True).returncode == 0 and os.path.exists(png):
                return svg, png, tool[0]
    return svg, None, "no PNG: neither matplotlib nor rsvg-convert / convert here (the SVG has the same curves)"


def finish(out):
    meta = json.load(open(os.path.join(out, "meta.json")))
    runs = {}
    for v in meta["variants"]:
        if os.path.exists(os.path.join(out, v + ".log")):
            runs[v] = read_run(out, v, meta["batch"], meta["seq"], meta["layers"])
    text = report(meta, runs)
    with open(os.path.join(out, "data_efficiency.md.tmp"), "w") as f:
        f.write(text)
    os.replace(os.path.join(out, "data_efficiency.md.tmp"), os.path.join(out, "data_efficiency.md"))
    with open(os.path.join(out, "data_efficiency.json"), "w") as f:
        json.dump(runs, f, indent=1)
    svg, png, how = write_plots(meta, runs, out)
    print(text)
    print(f"Curves: {svg}" + (f", {png} ({how})" if png else f" ({how})"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/release/tools/cutrain")
    ap.add_argument("--shape", default="gpt2_small")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--variants", default="")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--warmup", type=int, default=None, help="default: a tenth of --steps")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--eval_interval", type=int, default=None, help="default: a twentieth of --steps")
    ap.add_argument("--eval_steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--curriculum_fraction", type=float, default=0.385)
    ap.add_argument("--ltd_fraction", type=float, default=0.7)
    ap.add_argument("--ltd_min", type=int, default=0, help="random-LTD's first kept count (default: 128, at most S/4)")
    ap.add_argument("--composed_curriculum", default="vocabularyrarity",
                    help="the composed variant's curriculum: vocabularyrarity, seqlen or both")
    ap.add_argument("--data", default="")
    ap.add_argument("--corpus", nargs="+", default=[])
    ap.add_argument("--text_bytes", type=int, default=0)
    ap.add_argument("--budget", type=float, default=0)
    ap.add_argument("--out", default="build/data_efficiency")
    ap.add_argument("--report", default="", help="only the report, again, from this results folder")
    args = ap.parse_args()
    if args.report:
        if not os.path.exists(os.path.join(args.report, "meta.json")):
            die(f"--report: expected a results folder with meta.json, found none in '{args.report}'")
        finish(args.report)
        return

    # ---- every input checked before any work ----
    if args.shape not in SHAPES:
        die(f"--shape: expected one of {', '.join(SHAPES)}, found '{args.shape}'")
    if args.device not in ("cuda", "cpu"):
        die(f"--device: expected cuda or cpu, found '{args.device}'")
    if args.warmup is None:
        args.warmup = max(1, args.steps // 10)
    if args.eval_interval is None:
        args.eval_interval = max(1, args.steps // 20)
    if args.steps < 2 or not 1 <= args.warmup < args.steps:
        die(f"--steps / --warmup: expected steps >= 2 and 1 <= warmup < steps (WarmupCosineLR's warm-up), found "
            f"{args.steps} / {args.warmup}")
    if args.eval_interval < 1 or args.eval_steps < 1:
        die(f"--eval_interval / --eval_steps: expected at least 1, found {args.eval_interval} / {args.eval_steps}")
    for f in ("curriculum_fraction", "ltd_fraction"):
        if not 0 < getattr(args, f) <= 1:
            die(f"--{f}: expected a fraction in (0, 1], found {getattr(args, f)}")
    if args.lr <= 0:
        die(f"--lr: expected a positive rate, found {args.lr}")
    avail = available_variants()
    variants = [v for v in args.variants.split(",") if v] if args.variants else avail
    for v in variants:
        if v not in ORDER:
            die(f"--variants: unknown variant '{v}' (baseline, curriculum, seqlen, random_ltd, composed)")
        if v not in avail:
            die(f"--variants: '{v}' needs {CONFIGS[v]}, which this tree does not have")
    if args.composed_curriculum not in ("vocabularyrarity", "seqlen", "both"):
        die(f"--composed_curriculum: expected vocabularyrarity, seqlen or both, found '{args.composed_curriculum}'")
    if "composed" in variants and composed_uses(args, "seqlen") and not os.path.exists(os.path.join(ROOT, CONFIGS["seqlen"])):
        die(f"--composed_curriculum {args.composed_curriculum}: needs {CONFIGS['seqlen']}, which this tree does not have")
    if len(set(variants)) != len(variants):
        die(f"--variants: a variant named twice in '{args.variants}'")
    for p in args.corpus:
        if not os.path.exists(p):
            die(f"--corpus: '{p}' does not exist (a text file, a folder of them or a .tar.xz / .tar.gz archive)")
    if not os.access(args.bin, os.X_OK):
        die(f"--bin: {args.bin} is not an executable (build first: cmake --build build/release --target cutrain)")
    data = find_data(args.data)
    if not args.corpus and not os.path.exists(os.path.join(data, "wikitext-2", "valid.txt")):
        die(f"--data: expected wikitext-2/valid.txt under '{data}' (or pass --corpus)")
    desc, flags, layers, batch, seq = SHAPES[args.shape]
    if not 0 <= args.ltd_min <= seq:
        die(f"--ltd_min: expected random-LTD's first kept count in [1, {seq}] (the sequence of --shape {args.shape}), "
            f"found {args.ltd_min}")
    run_order = [v for v in ORDER if v in variants]

    # ---- data, index, configs ----
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    for f in glob.glob(os.path.join(args.out, "*.log")) + glob.glob(os.path.join(args.out, "*_metrics.jsonl")):
        os.remove(f)
    shards, corpus = prepare(args, data, args.out)
    s = schedules(args, layers, seq)
    rarity = "curriculum" in variants or ("composed" in variants and composed_uses(args, "vocabularyrarity"))
    index = analyze(args, shards, seq, args.out) if rarity else ""
    cfgs = {v: write_config(args, v, args.out, batch, seq, layers, os.path.abspath(index) if index else "", s)
            for v in variants}
    meta = {"shape": desc, "shape_name": args.shape, "corpus": corpus, "steps": args.steps, "lr": args.lr,
            "warmup": args.warmup, "seed": args.seed, "eval_interval": args.eval_interval, "eval_steps": args.eval_steps,
            "device": args.device, "variants": [v for v in SHOWN if v in variants], "batch": batch, "seq": seq,
            "layers": layers, "composed_curriculum": args.composed_curriculum,
            "schedules": describe_schedules(s, seq, layers, variants, args.composed_curriculum)}
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)

    # ---- the runs ----
    last, failed = None, []
    for v in run_order:
        left = args.budget - (time.time() - t_start)
        if args.budget > 0 and last is not None and left < last:
            with open(os.path.join(args.out, v + ".log"), "w") as f:
                f.write(f"skipped (budget: {left:.0f} s left, a run takes about {last:.0f} s)\n")
            print(f"== {v}: skipped (budget)", flush=True)
            continue
        print(f"== {v}: {label(meta, v)}", flush=True)
        last, rc = train(args, cfgs[v], shards, flags, batch, seq, v, args.out)
        r = read_run(args.out, v, batch, seq, layers)
        if rc != 0:
            failed.append(v)
            continue
        print(f"   final val {r['final']:.4f}, best {r['best']:.4f}, steps {r['t_steps']:.1f} s, wall {r['t_wall']:.1f} s, "
              f"process {last:.1f} s", flush=True)
    finish(args.out)
    if failed:
        die(f"{', '.join(failed)} failed (their logs in {args.out}); the report holds the others")


if __name__ == "__main__":
    main()
