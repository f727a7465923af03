#!/usr/bin/env python3
"""The sequence-length curriculum's tokens/s at each length against a fixed-length run, same call.

For each shape (GPT-2 small: hidden 768, 12 blocks, 12 heads, vocab 50257 padded, causal, batch 8
x 1024; the BF16 example's model causal, batch 4 x 512), a ramp run (the curriculum's
fixed_discrete schedule: each length of --lengths for --steps_per_length steps, seqlen_truncate
unless --metric seqlen_reshape) and, per length L, a fixed-length run of the same model (the same
--max_seq_len, --seq_length L; reshape: --batch_size its row count), in rounds that alternate which
side runs first. tokens/s per step come from --metrics_file (the real tokens: rows x L x
accumulation); per length the median over the ramp's steps at L past its first three (the eager
step, the capture, the first replay) and over the fixed run's steps past its warm-up, then the
median over the rounds. The issue's target: ramp tokens/s at each length >= 0.9 x the fixed run's.

    scripts/seqlen_bench.py --bin build/gpu/tools/cutrain [--lengths 128,256,512,1024]
        [--steps_per_length 12] [--rounds 3] [--shapes gpt2_small,bf16_example] [--out DIR]
--shapes tiny_cpu runs the script on the CPU backend (a smoke test of the script, no figure).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys

SHAPES = {
    "gpt2_small": {"flags": ["--model", "gpt2", "--hidden_dim", "768", "--num_layers", "12", "--num_heads", "12",
                             "--vocab_size", "50257"], "seq": 1024, "batch": 8},
    "bf16_example": {"flags": ["--attention", "causal"], "seq": 512, "batch": 4},
    "tiny_cpu": {"flags": ["--device", "cpu", "--hidden_dim", "32", "--num_heads", "2", "--num_layers", "2",
                           "--vocab_size", "64", "--attention", "causal"], "seq": 64, "batch": 2},
}


def reshape_rows(B, S, L):
    """Megatron-DeepSpeed's seqlen_reshape row count (train/seqlen_curriculum.h)."""
    if L >= S:
        return B
    n = min(math.ceil(B * (S + 1) / (L + 1)), B * ((S + 1) // (L + 1)) + B)
    return n - 1 if n > 1 and n % 2 else n


def write_config(out, batch, lengths=None, steps_per_length=0, metric="seqlen_truncate"):
    c = json.load(open("configs/curriculum_seqlen_gpt.json"))
    c["train_micro_batch_size_per_gpu"] = batch
    c.pop("scheduler", None)  # a constant lr: the timing does not depend on it
    if lengths is None:
        c.pop("data_efficiency")
    else:
        cl = c["data_efficiency"]["data_sampling"]["curriculum_learning"]
        m = cl["curriculum_metrics"].pop("seqlen_truncate")
        m.update({"min_difficulty": min(lengths), "max_difficulty": max(lengths), "schedule_type": "fixed_discrete",
                  "schedule_config": {"difficulty": lengths,
                                      "max_step": [steps_per_length * (i + 1) for i in range(len(lengths) - 1)]}})
        cl["curriculum_metrics"][metric] = m
    json.dump(c, open(out, "w"))


def run(args, cfg, flags, steps, metrics):
    cmd = [args.bin, "train", "--deepspeed_config", cfg, "--num_steps", str(steps), "--warmup_steps", "0",
           "--log_interval", "1000", "--metrics_file", metrics] + flags
    if os.path.exists(metrics):
        os.remove(metrics)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return [json.loads(l) for l in open(metrics)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/gpu/tools/cutrain")
    ap.add_argument("--lengths", default="")  # default: S/8, S/4, S/2, S
    ap.add_argument("--steps_per_length", type=int, default=12)
    ap.add_argument("--fixed_steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--metric", default="seqlen_truncate", choices=["seqlen_truncate", "seqlen_reshape"])
    ap.add_argument("--shapes", default="gpt2_small,bf16_example")
    ap.add_argument("--out", default="build/seqlen_bench")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for shape in args.shapes.split(","):
        sh = SHAPES[shape]
        S, B = sh["seq"], sh["batch"]
        lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else [S // 8, S // 4, S // 2, S]
        flags = sh["flags"] + ["--max_seq_len", str(S), "--batch_size", str(B)]
        ramp_cfg = os.path.join(args.out, f"{shape}_ramp.json")
        write_config(ramp_cfg, B, lengths, args.steps_per_length, args.metric)
        ramp = {L: [] for L in lengths}
        fixed = {L: [] for L in lengths}
        ramp_steps = args.steps_per_length * len(lengths)
        for r in range(args.rounds):
            def do_ramp():
                m = run(args, ramp_cfg, flags + ["--seq_length", str(S)], ramp_steps,
                        os.path.join(args.out, f"{shape}_ramp_r{r}.jsonl"))
                for L in lengths:
                    at = [x["tokens_per_s"] for x in m if x["curriculum_seqlen"] == L]
                    ramp[L].append(statistics.median(at[3:] if len(at) > 3 else at))

            def do_fixed():
                for L in lengths:
                    b = reshape_rows(B, S, L) if args.metric == "seqlen_reshape" else B
                    cfg = os.path.join(args.out, f"{shape}_fixed_{L}.json")
                    write_config(cfg, b)
                    f = sh["flags"] + ["--max_seq_len", str(S), "--batch_size", str(b), "--seq_length", str(L)]
                    m = run(args, cfg, f, args.fixed_steps, os.path.join(args.out, f"{shape}_fixed_{L}_r{r}.jsonl"))
                    fixed[L].append(statistics.median(x["tokens_per_s"] for x in m[3:] or m))

            for side in ((do_ramp, do_fixed) if r % 2 == 0 else (do_fixed, do_ramp)):
                side()
        for L in lengths:
            tr, tf = statistics.median(ramp[L]), statistics.median(fixed[L])
            rows.append({"shape": shape, "metric": args.metric, "seqlen": L, "ramp_tokens_s": tr, "fixed_tokens_s": tf,
                         "ratio": tr / tf, "met": tr / tf >= 0.9, "ramp_rounds": ramp[L], "fixed_rounds": fixed[L]})
    json.dump(rows, open(os.path.join(args.out, "seqlen_bench.json"), "w"), indent=1)
    print("| shape | metric | seqlen | ramp tokens/s | fixed tokens/s | ratio | target >= 0.9 |")
    print("|---|---|---:|---:|---:|---:|---|")
    for x in rows:
        print(f"| {x['shape']} | {x['metric']} | {x['seqlen']} | {x['ramp_tokens_s']:.0f} | {x['fixed_tokens_s']:.0f} | "
              f"{x['ratio']:.3f} | {'met' if x['met'] else 'missed'} |")


if __name__ == "__main__":
    main()
