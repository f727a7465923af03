#!/usr/bin/env python3
"""Issue #22's training figures: a dense model, the same model with an 8-expert MoE in every other
block, and PR-MoE (a pyramid of experts plus the residual dense MLP), trained on the same shards
(WikiText-2, or a --corpus) with the same seed, data order and schedule, with validation; then one
table.

    scripts/moe_quality.py --bin build/gpu/tools/cutrain [--shape bf16_example|gpt2_small|tiny]
        [--device cuda|cpu] [--steps N] [--warmup N] [--lr LR] [--eval_interval N] [--eval_steps N]
        [--experts 8] [--pyramid 4,4,4,4,8,8] [--top_k 1|2] [--capacity_factor F] [--use_rts true|false]
        [--data DIR] [--corpus PATH ...] [--text_bytes N] [--out DIR]

Variants (same config, `configs/baseline.json`: fp32 master, so precision is not a variable):
  dense   the shape as it is
  moe     --num_experts E --expert_interval 2 --top_k K: every other block's FFN becomes E experts of
          the FFN's size, so at top-1 each token's active FLOPs equal the dense model's (plus the
          gate's E x H); top-2 doubles the MoE blocks' FFN FLOPs
  prmoe   --num_experts PYRAMID --expert_interval 2 --top_k K --mlp_type residual: fewer experts in
          the early MoE blocks, each MoE block with the residual dense MLP beside its experts
Both MoE variants train at --capacity_factor (--moe_train_capacity_factor; evaluation at cutrain's
default 1.0) with token dropping; top-1 with random token selection unless --use_rts false
(cutrain's --moe_use_rts, DeepSpeed's use_rts: true by default, as DeepSpeed's MoE; false keeps
each full expert's first routes in token order).
The issue's targets, each printed with its verdict:
  - moe's final validation loss < dense's at the same steps and the same active FLOPs per token;
  - prmoe's within 1% of moe's, with fewer parameters;
  - moe's step time <= 1.3x dense's (the median of steps after the first eval_interval, which
    leaves out the warm-up and the evaluation steps' own time);
  - tokens dropped: the sum over steps and MoE blocks of the routes that found their expert full,
    and their share of all routes.
--shape tiny on --device cpu checks the tool (the e2e test); it decides no target.

Data: WikiText-2 valid + test (10% held out) from --data, or --corpus: text files, folders or
.tar.xz / .tar.gz archives (scripts/corpus-linux-doc.sh's Debian linux-doc corpus: 7.26M training
and 0.77M validation tokens), put in an order fixed by a hash of their names and tokenized by
`cutrain prepare-data` with 10% of the documents held out (scripts/wikitext_shards.py, shared with
data_efficiency_quality.py).
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys

from wikitext_shards import corpus_inputs, prepare_shards, shard_tokens, wikitext_inputs

SHAPES = {
    "bf16_example": ("the BF16 example's model (h 1024, 12 blocks, 16 heads), batch 4 x seq 512",
                     ["--hidden_dim", "1024", "--num_layers", "12", "--num_heads", "16", "--batch_size", "4",
                      "--seq_length", "512"], 12),
    "gpt2_small": ("GPT-2 small's shape (h 768, 12 blocks, 12 heads), batch 4 x seq 512",
                   ["--hidden_dim", "768", "--num_layers", "12", "--num_heads", "12", "--batch_size", "4",
                    "--seq_length", "512"], 12),
    # head_dim 64: the GPU's attention takes 64 or 128
    "tiny": ("tiny (h 128, 4 blocks, 2 heads), batch 2 x seq 32",
             ["--hidden_dim", "128", "--num_layers", "4", "--num_heads", "2", "--batch_size", "2", "--seq_length", "32"], 4),
}


def die(msg):
    sys.stderr.write(f"moe_quality: {msg}\n")
    raise SystemExit(2)


def find_data(arg, corpus):
    need = os.path.join("gpt2", "encoder.json") if corpus else os.path.join("wikitext-2", "valid.txt")
    for d in ([arg] if arg else [os.environ.get("CUTRAIN_DATA_DIR", ""), "../shared/data", ".devdata"]):
        if d and os.path.exists(os.path.join(d, need)) and os.path.exists(os.path.join(d, "gpt2", "encoder.json")):
            return d
    die(f"--data: expected {need} under '{arg or '(none found)'}' (" +
        ("the GPT-2 tokenizer files" if corpus else "WikiText-2 and the GPT-2 tokenizer files, or pass --corpus") + ")")


def prepare(args, data, out):
    """The shards (PREFIX_train_*.bin, PREFIX_val_*.bin) and a description of the text."""
    ddir = os.path.join(out, "data")
    os.makedirs(ddir, exist_ok=True)
    for f in os.listdir(ddir):
        if f.startswith("moeq_") and f.endswith(".bin"):
            os.remove(os.path.join(ddir, f))
    if args.corpus:
        inputs, name = corpus_inputs(args.corpus, ddir, args.text_bytes, die)
    else:
        inputs, name = wikitext_inputs(data, ddir, args.text_bytes), "WikiText-2 valid+test"
    stdout = prepare_shards(args.bin, inputs, data, os.path.join(ddir, "moeq"), die)
    return os.path.join(ddir, "moeq"), f"{name}, 10% of its documents held out: {shard_tokens(stdout)}"


def write_config(args, out):
    c = json.load(open("configs/baseline.json"))
    c["scheduler"] = {"type": "WarmupCosineLR", "params": {"total_num_steps": args.steps, "warmup_num_steps": args.warmup,
                      "warmup_type": "linear", "warmup_min_ratio": 0.0, "cos_min_ratio": 0.1}}
    if args.gradient_clipping > 0:
        c["gradient_clipping"] = args.gradient_clipping
    path = os.path.join(out, "config.json")
    with open(path + ".tmp", "w") as f:
        json.dump(c, f, indent=2)
    os.replace(path + ".tmp", path)
    return path


def variants(args, layers):
    moe_blocks = layers // 2
    pyramid = args.pyramid or ",".join([str(max(1, args.experts // 2))] * (moe_blocks - moe_blocks // 3) +
                                       [str(args.experts)] * (moe_blocks // 3))
    if len(pyramid.split(",")) != moe_blocks:
        die(f"--pyramid: expected {moe_blocks} counts (one per MoE block: every other of {layers}), found '{pyramid}'")
    if min(int(n) for n in pyramid.split(",")) < args.top_k:
        die(f"--top_k {args.top_k}: every MoE block needs at least {args.top_k} experts, --pyramid has '{pyramid}'")
    routing = ["--expert_interval", "2", "--top_k", str(args.top_k), "--moe_train_capacity_factor", str(args.capacity_factor)]
    if args.top_k == 1:
        routing += ["--moe_use_rts", args.use_rts or "true"]
    return [
        ("dense", "dense", []),
        ("moe", f"MoE, {args.experts} experts every other block, top-{args.top_k}",
         ["--num_experts", str(args.experts), *routing]),
        ("prmoe", f"PR-MoE, experts {pyramid}, residual MLP, top-{args.top_k}",
         ["--num_experts", pyramid, *routing, "--mlp_type", "residual"]),
    ]


def train(args, cfg, shards, shape_flags, name, extra, out):
    log = os.path.join(out, name + ".log")
    metrics = os.path.join(out, name + "_metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [args.bin, "train", "--deepspeed_config", cfg, "--device", args.device, *shape_flags, "--pad_vocab",
           "--use_real_data", "--data", shards + "_train_*.bin", "--eval_data", shards + "_val_*.bin",
           "--num_steps", str(args.steps), "--warmup_steps", str(min(10, args.steps - 1)), "--learning_rate", str(args.lr),
           "--seed", str(args.seed), "--eval_interval", str(args.eval_interval), "--eval_steps", str(args.eval_steps),
           "--log_interval", str(args.eval_interval), "--metrics_file", metrics, *extra]
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    text = open(log).read()
    if p.returncode != 0:
        die(f"{name} failed (rc {p.returncode}); tail of {log}:\n" + text[-2000:])
    return text, [json.loads(l) for l in open(metrics) if l.strip()]


def summarize(text, rows, eval_interval):
    params = int(re.search(r"Model parameters: ([0-9,]+) total", text).group(1).replace(",", ""))
    evals = [float(v) for v in re.findall(r"val_loss=([0-9.]+)", text.split("FINAL RESULTS")[0])]
    times = [r["step_time_s"] for r in rows if r["step"] >= eval_interval and "val_loss" not in r]
    if not times:
        times = [r["step_time_s"] for r in rows]
    dropped = routes = 0
    for r in rows:
        for b in r.get("moe", []):
            dropped += b["dropped"]
            routes += b["routes"] if "routes" in b else 0
    return {"params": params, "final_val": evals[-1], "best_val": min(evals), "step_s": statistics.median(times),
            "dropped": dropped, "steps": len(rows), "moe_blocks": len(rows[-1].get("moe", [])) if rows else 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/release/tools/cutrain")
    ap.add_argument("--shape", default="bf16_example", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--eval_interval", type=int, default=100)
    ap.add_argument("--eval_steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--gradient_clipping", type=float, default=0.0,
                    help="DeepSpeed's gradient_clipping for every variant (0, the default: none, as configs/baseline.json)")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--pyramid", default="", help="experts per MoE block for prmoe (default: E/2 then E for the last third)")
    ap.add_argument("--top_k", type=int, default=1, help="routes per token of both MoE variants (1 or 2)")
    ap.add_argument("--capacity_factor", type=float, default=1.0, help="the MoE variants' training capacity factor")
    ap.add_argument("--use_rts", choices=["true", "false"], default=None,
                    help="top-1's random token selection (--moe_use_rts; default true, DeepSpeed's); top-2 has none")
    ap.add_argument("--data", default="")
    ap.add_argument("--corpus", nargs="+", default=[], help="text files, folders or .tar.xz / .tar.gz archives instead of WikiText-2")
    ap.add_argument("--text_bytes", type=int, default=0)
    ap.add_argument("--out", default="build/moe_quality")
    args = ap.parse_args()
    if args.steps < 2 or not 0 <= args.warmup < args.steps:
        die(f"--steps / --warmup: expected steps >= 2 and 0 <= warmup < steps, found {args.steps} / {args.warmup}")
    if args.eval_interval < 1 or args.eval_steps < 1:
        die("--eval_interval and --eval_steps: expected at least 1")
    if not args.gradient_clipping >= 0:
        die(f"--gradient_clipping: expected a norm >= 0 (0: no clipping), found {args.gradient_clipping}")
    if args.experts < 2:
        die(f"--experts: expected at least 2, found {args.experts}")
    if args.top_k not in (1, 2):
        die(f"--top_k: expected 1 or 2, found {args.top_k}")
    if not (args.capacity_factor > 0 and math.isfinite(args.capacity_factor)):
        die(f"--capacity_factor: expected a finite number > 0, found {args.capacity_factor}")
    if args.use_rts == "true" and args.top_k != 1:
        die(f"--use_rts true: random token selection is top-1's, found --top_k {args.top_k}")
    for p in args.corpus:
        if not os.path.exists(p):
            die(f"--corpus: '{p}' does not exist (a text file, a folder of them or a .tar.xz / .tar.gz archive)")
    if not os.access(args.bin, os.X_OK):
        die(f"--bin: {args.bin} is not an executable (build first: cmake --build build/release --target cutrain)")
    desc, shape_flags, layers = SHAPES[args.shape]
    vs = variants(args, layers)
    data = find_data(args.data, args.corpus)
    os.makedirs(args.out, exist_ok=True)
    shards, corpus = prepare(args, data, args.out)
    cfg = write_config(args, args.out)

    res = {}
    for name, what, extra in vs:
        print(f"== {name}: {what}", flush=True)
        text, rows = train(args, cfg, shards, shape_flags, name, extra, args.out)
        res[name] = summarize(text, rows, args.eval_interval)
        res[name]["what"] = what
        print(f"   final val {res[name]['final_val']:.4f}, step {res[name]['step_s'] * 1e3:.2f} ms, "
              f"{res[name]['params']:,} params, dropped {res[name]['dropped']}", flush=True)

    tokens = int(shape_flags[shape_flags.index("--batch_size") + 1]) * int(shape_flags[shape_flags.index("--seq_length") + 1])
    lines = [f"## MoE against dense: {desc}, {corpus}, {args.steps} steps, lr {args.lr}, "
             f"{args.warmup} warm-up + cosine to 0.1, seed {args.seed}, fp32 master (configs/baseline.json), "
             f"{f'gradient clipping {args.gradient_clipping:g}' if args.gradient_clipping > 0 else 'no gradient clipping'}, "
             f"MoE top-{args.top_k} at capacity factor {args.capacity_factor:g}"
             f"{'' if args.top_k != 1 else ', first routes kept' if args.use_rts == 'false' else ', random token selection'}"
             f", {args.device}", "",
             "| variant | parameters | final val loss | vs dense | best val loss | step ms | vs dense | routes dropped |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    d = res["dense"]
    for name, what, _ in vs:
        r = res[name]
        routes = args.top_k * tokens * r["moe_blocks"] * r["steps"]  # k routes per token and MoE block
        drop = f"{r['dropped']:,} ({100.0 * r['dropped'] / routes:.2f}%)" if routes else "-"
        lines.append(f"| {what} | {r['params']:,} | {r['final_val']:.4f} | {100 * (r['final_val'] / d['final_val'] - 1):+.2f}% | "
                     f"{r['best_val']:.4f} | {r['step_s'] * 1e3:.2f} | {r['step_s'] / d['step_s']:.2f}x | {drop} |")
    m, p = res["moe"], res["prmoe"]
    verdict = lambda ok: "met" if ok else "MISSED"
    lines += ["",
              f"- MoE's validation loss below dense's at equal active FLOPs"
              f"{'' if args.top_k == 1 else ' (top-2: twice the FFN FLOPs in MoE blocks)'}: "
              f"{m['final_val']:.4f} vs {d['final_val']:.4f}: {verdict(m['final_val'] < d['final_val'])}",
              f"- PR-MoE within 1% of MoE with fewer parameters: {100 * (p['final_val'] / m['final_val'] - 1):+.2f}%, "
              f"{p['params']:,} vs {m['params']:,} parameters: "
              f"{verdict(p['final_val'] <= 1.01 * m['final_val'] and p['params'] < m['params'])}",
              f"- MoE step <= 1.3x dense: {m['step_s'] / d['step_s']:.2f}x: {verdict(m['step_s'] <= 1.3 * d['step_s'])}"]
    if args.shape == "tiny":
        lines.append("- (tiny shape: a check of the tool, not a figure of the issue)")
    report = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "moe_quality.md"), "w") as f:
        f.write(report)
    with open(os.path.join(args.out, "moe_quality.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(report)


if __name__ == "__main__":
    main()
