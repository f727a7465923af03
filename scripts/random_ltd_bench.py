#!/usr/bin/env python3
"""random-LTD's step time at kept fractions f against the full-sequence step, same call.

For each shape (the BF16 example's model: configs/random_ltd.json's model at its defaults, hidden
1024, 12 blocks, batch 4 x 512, bidirectional; GPT-2 small: hidden 768, 12 blocks, 12 heads, vocab
50257 padded, causal, batch 8 x 1024) and each block set (all blocks drop, or DeepSpeed's layout:
every block but the first and the last), the step time of a constant kept count f x S
(min_value = max_value) against the same config with data_routing.enabled false, in rounds that
alternate the order; the median per row. The issue's target: step(f) <= (f + 0.08) x step(full).
A block that does not drop, the embedding, the head and the optimizer do not shrink with f, so
the "ideal" column is what perfect scaling of the dropping blocks alone would give, from the
--timing_report of the full run (the layerNN regions' share of the step).

    scripts/random_ltd_bench.py --bin build/gpu/tools/cutrain [--fractions 0.5,0.75] [--rounds 3]
        [--steps 30] [--shapes bf16_example,gpt2_small] [--out DIR]
--shapes tiny_cpu runs the script on the CPU backend (a smoke test of the script, no figure).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

SHAPES = {
    "bf16_example": {"flags": [], "layers": 12, "seq": 512, "batch": 4, "model_type": "encoder"},
    "gpt2_small": {"flags": ["--hidden_dim", "768", "--num_layers", "12", "--num_heads", "12", "--vocab_size", "50257",
                             "--pad_vocab", "--attention", "causal", "--seq_length", "1024", "--batch_size", "8"],
                   "layers": 12, "seq": 1024, "batch": 8, "model_type": "decoder"},
    # A smoke test of the script itself on the CPU backend (no timing report there).
    "tiny_cpu": {"flags": ["--device", "cpu", "--hidden_dim", "32", "--num_heads", "2", "--num_layers", "3",
                           "--vocab_size", "64", "--seq_length", "64", "--batch_size", "2"],
                 "layers": 3, "seq": 64, "batch": 2, "model_type": "encoder", "no_report": True},
}


def write_config(out, kept, ids, layers, model_type, batch):
    c = json.load(open("configs/random_ltd.json"))
    c["train_micro_batch_size_per_gpu"] = batch  # the config's micro batch wins over --batch_size
    r = c["data_efficiency"]["data_routing"]
    if kept is None:
        r["enabled"] = False
    r = r["random_ltd"]
    r.update({"total_layer_num": layers, "random_ltd_layer_num": len(ids), "random_ltd_layer_id": ids,
              "model_type": model_type})
    r.pop("model_mask_name", None)
    if kept is not None:
        r["random_ltd_schedule"].update({"min_value": kept, "max_value": kept,
                                         "schedule_config": {"require_steps": 1, "seq_per_step": 16}})
    json.dump(c, open(out, "w"))


def run(args, cfg, flags, extra=(), steps=None):
    cmd = [args.bin, "train", "--deepspeed_config", cfg, "--num_steps", str(steps or args.steps), "--warmup_steps",
           str(args.warmup if not steps else 4), "--log_interval", "1000"] + flags + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise SystemExit(f"failed: {' '.join(cmd)}")
    m = re.search(r"avg_step_time=([0-9.eE+-]+)", p.stdout)
    if not m:
        raise SystemExit(f"no avg_step_time in the output of {' '.join(cmd)}")
    return float(m.group(1)), p.stdout


def block_share(report_path):
    """The blocks' fraction of the step: the step/fwd/layerNN and step/bwd/layerNN regions' % of
    the step in a --timing_report JSON (the recompute, when on, sits inside them)."""
    try:
        rep = json.load(open(report_path))
    except (OSError, ValueError):
        return None
    pct = sum(r.get("pct_of_step", 0.0) for r in rep.get("regions", [])
              if re.fullmatch(r"step/(fwd|bwd)/layer\d\d", r.get("name", "")))
    return pct / 100 if pct > 0 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/gpu/tools/cutrain")
    ap.add_argument("--fractions", default="0.5,0.75")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--shapes", default="bf16_example,gpt2_small")
    ap.add_argument("--out", default="build/random_ltd_bench")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    fractions = [float(f) for f in args.fractions.split(",")]
    rows = []
    for shape in args.shapes.split(","):
        sh = SHAPES[shape]
        L, S = sh["layers"], sh["seq"]
        share = None  # from the all-blocks pass's full run
        for layout, ids in (("all_blocks", list(range(L))), ("deepspeed_1..L-2", list(range(1, L - 1)))):
            cases = [("full", None)] + [(f"f={f}", int(round(f * S / 16)) * 16) for f in fractions]
            cfgs = {}
            for name, kept in cases:
                cfgs[name] = os.path.join(args.out, f"{shape}_{layout}_{name}.json".replace("..", "_"))
                write_config(cfgs[name], kept, ids, L, sh["model_type"], sh["batch"])
            times = {name: [] for name, _ in cases}
            for r in range(args.rounds):
                order = cases if r % 2 == 0 else list(reversed(cases))
                for name, _ in order:
                    times[name].append(run(args, cfgs[name], sh["flags"])[0])
            if layout == "all_blocks" and not sh.get("no_report"):
                rep = os.path.join(args.out, f"{shape}_timing_full.json")
                run(args, cfgs["full"], sh["flags"], ["--timing_report", rep], steps=12)
                share = block_share(rep)
                # The first fraction's report shows the ltd_* regions (ltd_sum, gather, merge, scatter).
                run(args, cfgs[cases[1][0]], sh["flags"],
                    ["--timing_report", os.path.join(args.out, f"{shape}_timing_{cases[1][0]}.json")], steps=12)
            full = statistics.median(times["full"])
            for name, kept in cases[1:]:
                f = kept / S
                t = statistics.median(times[name])
                ideal = 1 - (1 - f) * share * len(ids) / L if share else None
                rows.append({"shape": shape, "blocks": layout, "f": f, "kept": kept, "step_s": t, "full_s": full,
                             "ratio": t / full, "target": f + 0.08, "met": t / full <= f + 0.08,
                             "ideal_ratio": ideal, "rounds": times[name], "full_rounds": times["full"]})
    json.dump(rows, open(os.path.join(args.out, "random_ltd_bench.json"), "w"), indent=1)
    print("| shape | dropping blocks | f (kept) | step (s) | full (s) | ratio | target f+0.08 | met | ideal |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        ideal = f"{r['ideal_ratio']:.3f}" if r["ideal_ratio"] else "-"
        print(f"| {r['shape']} | {r['blocks']} | {r['f']:.3f} ({r['kept']}) | {r['step_s']:.5f} | {r['full_s']:.5f} | "
              f"{r['ratio']:.3f} | {r['target']:.3f} | {'yes' if r['met'] else 'no'} | {ideal} |")


if __name__ == "__main__":
    main()
