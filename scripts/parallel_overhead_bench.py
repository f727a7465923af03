#!/usr/bin/env python3
"""The GPU engine's pipeline and tensor-parallel code paths against the plain engine, same call.

Issue #23's target on one GPU: a pipeline of one stage (--pipeline_parallel_size 1: the step
through the 1F1B program of train/gpu_pipeline.h) and tensor parallelism of degree 1
(--tensor_parallel_size 1: the blocks' all-reduces over a one-rank NCCL communicator) cost at most
3% over the plain engine: step(variant) / step(plain) <= 1.03. Virtual stages
(--pipeline_stages_in_process P: every stage in this one process, activations handed between the
stages' models as device copies) are measured beside them, without a target: they show the
schedule's per-micro-batch bookkeeping (more, smaller kernel sequences, the hand-over copies).

The model and config: configs/bf16_full.json's (the BF16 example's model at its defaults, hidden
1024, 12 blocks, batch 4 x 512) with ZeRO stage 0 (one process: no communicator either way) at each
gradient_accumulation_steps of --accum (the config's 1, and 8 micro-batches so the schedule has
something to order). Each variant runs --steps steps (the first --warmup left out of the average:
cutrain's avg_step_time), in --rounds rounds that alternate the order; the median per variant.

    scripts/parallel_overhead_bench.py --bin build/gpu/tools/cutrain [--rounds 3] [--steps 30]
        [--accum 1,8] [--virtual 2,4] [--out DIR]
--smoke_cpu runs the degree-1 variants on the CPU backend with a tiny model (a test of the script,
no figure: on the CPU the flags at degree 1 run the plain backend).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

TARGET = 1.03


def write_config(path, accum):
    c = json.load(open("configs/bf16_full.json"))
    c["zero_optimization"]["stage"] = 0
    c["gradient_accumulation_steps"] = accum
    json.dump(c, open(path, "w"))


def run(args, cfg, flags):
    cmd = [args.bin, "train", "--deepspeed_config", cfg, "--num_steps", str(args.steps), "--warmup_steps",
           str(args.warmup), "--log_interval", "1000"] + args.model + flags
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise SystemExit(f"failed: {' '.join(cmd)}")
    m = re.search(r"avg_step_time=([0-9.eE+-]+)", p.stdout)
    if not m:
        raise SystemExit(f"no avg_step_time in the output of {' '.join(cmd)}")
    peak = re.search(r"peak_mem_bytes=([0-9]+)", p.stdout)
    return float(m.group(1)), int(peak.group(1)) / 2**30 if peak else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/gpu/tools/cutrain")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--accum", default="1,8")
    ap.add_argument("--virtual", default="2,4", help="virtual stage counts ('' for none)")
    ap.add_argument("--out", default="build/parallel_overhead")
    ap.add_argument("--smoke_cpu", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    args.model = []
    variants = [("plain", []), ("pp1", ["--pipeline_parallel_size", "1"]), ("tp1", ["--tensor_parallel_size", "1"]),
                ("pp1+tp1", ["--pipeline_parallel_size", "1", "--tensor_parallel_size", "1"])]
    if args.smoke_cpu:
        args.model = ["--device", "cpu", "--hidden_dim", "32", "--num_heads", "2", "--num_layers", "2",
                      "--vocab_size", "64", "--seq_length", "16", "--batch_size", "4"]
    else:
        variants += [(f"virtual{p}", ["--pipeline_stages_in_process", p, "--partition_method", "uniform"])
                     for p in args.virtual.split(",") if p]
    rows = []
    for accum in [int(a) for a in args.accum.split(",")]:
        cfg = os.path.join(args.out, f"bf16_full_stage0_accum{accum}.json")
        write_config(cfg, accum)
        times = {n: [] for n, _ in variants}
        peaks = {}
        for r in range(args.rounds):
            for name, flags in (variants if r % 2 == 0 else list(reversed(variants))):
                t, peak = run(args, cfg, flags)
                times[name].append(t)
                peaks[name] = peak
        plain = statistics.median(times["plain"])
        for name, _ in variants:
            t = statistics.median(times[name])
            degree1 = name in ("pp1", "tp1", "pp1+tp1")
            rows.append({"accum": accum, "variant": name, "step_s": t, "plain_s": plain, "ratio": t / plain,
                         "target": TARGET if degree1 else None, "met": (t / plain <= TARGET) if degree1 else None,
                         "peak_gb": peaks.get(name), "rounds": times[name]})
    json.dump(rows, open(os.path.join(args.out, "parallel_overhead.json"), "w"), indent=1)
    print("| accum | variant | step (s) | plain (s) | ratio | target | met | peak GB | rounds (s) |")
    print("|---:|---|---:|---:|---:|---:|---|---:|---|")
    for r in rows:
        tgt = f"{r['target']:.2f}" if r["target"] else "-"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "no")
        peak = f"{r['peak_gb']:.2f}" if r["peak_gb"] is not None else "-"
        rounds = " ".join(f"{x:.5f}" for x in r["rounds"])
        print(f"| {r['accum']} | {r['variant']} | {r['step_s']:.5f} | {r['plain_s']:.5f} | {r['ratio']:.4f} | {tgt} | "
              f"{met} | {peak} | {rounds} |")


if __name__ == "__main__":
    main()
