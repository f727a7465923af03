#!/usr/bin/env python3
"""Issue #20's fp16 numerics target on the device: BERT's masked-LM trained with fp16 and dynamic
loss scaling reaches, after the same steps on the same WikiText-2 batches, a validation loss within
1% of the bf16 run's.

Both runs are `cutrain train --model bert` with the same model config, seed, data, masking and LAMB
settings; they differ only in the DeepSpeed config's precision block (configs/bert_large_lamb_seq128.json
and its _fp16 twin, the micro-batch set by --batch). Prints each run's validation loss, its fp16 loss
scale history (overflows logged by the engine) and the relative difference, and writes a JSON file.

Usage (tree root, after the build; the data folder holds wikitext-2/ and gpt2/):
  scripts/fp16_quality.py --bin build/gpu/tools/cutrain --data ../shared/data [--steps 300]
      [--bert_config configs/bert_large.json] [--batch 64] [--json fp16_quality.json]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wikitext_shards import prepare_shards, wikitext_inputs  # noqa: E402

CONFIGS = {"bf16": "configs/bert_large_lamb_seq128.json", "fp16": "configs/bert_large_lamb_seq128_fp16.json"}


def die(msg):
    print(f"fp16_quality: {msg}", file=sys.stderr)
    sys.exit(1)


def train(a, dtype, work, shards):
    cfg = json.load(open(CONFIGS[dtype]))
    cfg["train_micro_batch_size_per_gpu"] = a.batch
    cfg.pop("train_batch_size", None)
    path = os.path.join(work, f"ds_{dtype}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    metrics = os.path.join(work, f"metrics_{dtype}.jsonl")
    cmd = [a.bin, "train", "--model", "bert", "--bert_config", a.bert_config, "--deepspeed_config", path,
           "--max_seq_length", "128", "--max_predictions_per_seq", "20", "--num_steps", str(a.steps),
           "--warmup_steps", str(a.warmup), "--seed", "42", "--use_real_data", "--data", shards + "_train_*.bin",
           "--eval_data", shards + "_val_*.bin", "--eval_interval", "0", "--eval_steps", str(a.eval_steps),
           "--log_interval", "50", "--metrics_file", metrics]
    p = subprocess.run(cmd, capture_output=True, text=True)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        die(f"{dtype} run failed (rc {p.returncode}):\n" + "\n".join(out.strip().splitlines()[-8:]))
    m = re.search(r"SUMMARY: .*avg_step_time=([0-9.eE+-]+) val_loss=([0-9.]+)", out)
    if not m:
        die(f"{dtype} run printed no SUMMARY with val_loss:\n" + "\n".join(out.strip().splitlines()[-8:]))
    r = {"dtype": dtype, "val_loss": float(m.group(2)), "step_s": float(m.group(1)),
         "overflows": re.findall(r"\[fp16\] overflow at step (\d+): loss scale (\S+) -> (\S+)", out)}
    scales = []
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            if "loss_scale" in j:
                scales.append(j["loss_scale"])
    if scales:
        r["loss_scale_first_last"] = [scales[0], scales[-1]]
    print(f"  {dtype}: val_loss {r['val_loss']:.4f}, {r['step_s'] * 1e3:.2f} ms/step, "
          f"{len(r['overflows'])} overflow(s)" + (f", loss scale {scales[0]:g} -> {scales[-1]:g}" if scales else ""),
          flush=True)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/gpu/tools/cutrain")
    ap.add_argument("--data", required=True, help="folder with wikitext-2/ and gpt2/")
    ap.add_argument("--bert_config", default="configs/bert_large.json")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--eval_steps", type=int, default=20)
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--json", default="fp16_quality.json")
    a = ap.parse_args()
    for k in ("bin", "bert_config"):
        if not os.path.exists(getattr(a, k)):
            die(f"--{k} {getattr(a, k)}: no such file")
    work = tempfile.mkdtemp(prefix="fp16_quality_")
    shards = os.path.join(work, "wikitext")
    prepare_shards(a.bin, wikitext_inputs(a.data, work), a.data, shards, die)
    runs = [train(a, d, work, shards) for d in ("bf16", "fp16")]
    rel = runs[1]["val_loss"] / runs[0]["val_loss"] - 1.0
    res = {"steps": a.steps, "batch": a.batch, "bert_config": a.bert_config, "runs": runs, "fp16_vs_bf16": rel,
           "met": abs(rel) <= a.tolerance}
    with open(a.json + ".tmp", "w") as f:
        json.dump(res, f, indent=1)
    os.replace(a.json + ".tmp", a.json)
    print(f"fp16 vs bf16 validation loss after {a.steps} steps: {runs[1]['val_loss']:.4f} / {runs[0]['val_loss']:.4f}"
          f" = {rel * 100:+.2f}% ({'met' if res['met'] else 'missed'}: within {a.tolerance * 100:g}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
