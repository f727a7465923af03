#!/usr/bin/env python3
"""cutrain's side of issue #20's BERT-Large targets on one GPU, as `cutrain train --model bert` runs:

  step      the full training step (LAMB) at seq 128 x micro-batch 64 and seq 512 x 16, in each of
            --dtypes (bf16: configs/bert_large_lamb_seq*.json; fp16: their _fp16 twins, dynamic loss
            scaling): step time, samples/s, peak memory (the loop's SUMMARY line)
  layer     one encoder layer's forward + backward inside the step: the timing report's
            `fwd/layer*` and `bwd/layer*` rows (eager steps), per layer and micro-batch
  flags     seq 512 x 16 with each memory flag alone and all three: peak memory and step time
            against no flag (the saving against the model's prediction is checked by the GPU test
            BertGpuMemory.EachFlagSavesThePredictedBytes; here the whole run's peak)
  maxbatch  the largest micro-batch at seq 512 whose peak stays under --mem_cap_gb, without and
            with the three flags: the peak at two batch sizes fitted as a line (peak is
            affine in the batch: the state plus per-sample activations), the predicted largest
            batch run once to confirm it fits (and the next one above it to confirm it does not)

Writes a JSON file and prints a table. Usage (from the tree's root, after the build):
  scripts/bert_bench.py --bin build/gpu/tools/cutrain [--parts step,layer,flags,maxbatch]
      [--mem_cap_gb 40] [--steps 15] [--dtypes bf16,fp16] [--json FILE]
The other parts run in bf16.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import step_floor  # scripts/: the timing report's leaf regions

FLAGS = ["--gelu_checkpoint", "--normalize_invertible", "--attention_dropout_checkpoint"]
SHAPES = {128: ("configs/bert_large_lamb_seq128.json", 64, 20), 512: ("configs/bert_large_lamb_seq512.json", 16, 80)}


def run(a, seq, batch=None, extra=(), timing=None, steps=None, dtype="bf16"):
    cfg, _, max_pred = SHAPES[seq]
    if dtype == "fp16":
        cfg = cfg.replace(".json", "_fp16.json")
    cmd = [a.bin, "train", "--model", "bert", "--bert_config", "configs/bert_large.json", "--deepspeed_config", cfg,
           "--max_seq_length", str(seq), "--max_predictions_per_seq", str(max_pred),
           "--num_steps", str(steps or a.steps), "--warmup_steps", "5", "--log_interval", "100"]
    if batch is not None:  # the same DeepSpeed config at another micro-batch (--batch_size must agree with it)
        c = json.load(open(cfg))
        c["train_micro_batch_size_per_gpu"] = batch
        c.pop("train_batch_size", None)
        tmp = os.path.join(a.tmp, f"ds_seq{seq}_b{batch}.json")
        with open(tmp, "w") as f:
            json.dump(c, f)
        cmd[cmd.index(cfg)] = tmp
    if timing:
        cmd += ["--timing_report", timing]
    cmd += list(extra)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    out = p.stdout + p.stderr
    m = re.search(r"SUMMARY: .*peak_mem_bytes=(\d+) .*avg_step_time=([0-9.eE+-]+)", out)
    r = {"seq": seq, "dtype": dtype, "batch": batch or SHAPES[seq][1], "flags": [f for f in extra if f in FLAGS], "rc": p.returncode,
         "wall_s": round(time.time() - t0, 1)}
    if p.returncode == 0 and m:
        r["peak_gb"] = int(m.group(1)) / 1e9
        r["step_s"] = float(m.group(2))
        r["samples_s"] = r["batch"] / r["step_s"]
    else:
        r["error"] = "\n".join(out.strip().splitlines()[-4:])
    print(f"  run {dtype} seq {seq} batch {r['batch']} {' '.join(r['flags']) or 'no flags'}: "
          + (f"{r['step_s'] * 1e3:.2f} ms, {r['samples_s']:.1f} samples/s, peak {r['peak_gb']:.2f} GB"
             if "step_s" in r else f"rc={p.returncode} {r.get('error', '')}"), flush=True)
    return r


def layer_ms(path):
    rep = json.load(open(path))
    fwd = bwd = None
    for row in rep.get("regions_by_kind", []):
        n = row["name"]
        if n.endswith("fwd/layer*"):
            fwd = row["total_ms"] / row["calls"]
        elif n.endswith("bwd/layer*"):
            bwd = row["total_ms"] / row["calls"]
    return fwd, bwd


def step_split(path):
    """The step's time by kind from a timing report: the GEMMs (leaf regions with a GEMM peak
    fraction, attention excluded), the attention kernels, the optimizer and the rest."""
    rep = json.load(open(path))
    rows = rep.get("regions_by_kind", [])
    step = next((r["ms_per_step"] for r in rows if r["name"] == "step"), None)
    if step is None:
        return None
    split = {"step_ms": step, "gemm_ms": 0.0, "attention_ms": 0.0, "optimizer_ms": 0.0, "gemm_tflop": 0.0}
    for r in step_floor.leaves(rep):
        last = r["name"].rsplit("/", 1)[-1]
        if "attention" in last:
            split["attention_ms"] += r["ms_per_step"]
        elif "frac_gemm_peak" in r:
            split["gemm_ms"] += r["ms_per_step"]
            split["gemm_tflop"] += r.get("tflops", 0.0) * r["ms_per_step"] * 1e-3
        elif r["name"].startswith("step/optimizer"):
            split["optimizer_ms"] += r["ms_per_step"]
    split["other_ms"] = step - split["gemm_ms"] - split["attention_ms"] - split["optimizer_ms"]
    split["gemm_frac_of_measured_peak"] = (split["gemm_tflop"] / (split["gemm_ms"] * 1e-3)
                                           / rep["peaks"]["gemm_tflops_measured"]) if split["gemm_ms"] else None
    return split


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/gpu/tools/cutrain")
    ap.add_argument("--parts", default="step,layer,flags,maxbatch")
    ap.add_argument("--mem_cap_gb", type=float, default=40.0)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--dtypes", default="bf16,fp16", help="the step part's precisions")
    ap.add_argument("--json", default="bert_bench.json")
    a = ap.parse_args()
    a.tmp = tempfile.mkdtemp(prefix="bert_bench_")
    parts = a.parts.split(",")
    dtypes = a.dtypes.split(",")
    if not set(dtypes) <= {"bf16", "fp16"}:
        sys.exit(f"bert_bench: --dtypes takes bf16 and/or fp16, got {a.dtypes}")
    res = {"mem_cap_gb": a.mem_cap_gb}

    def save():
        with open(a.json + ".tmp", "w") as f:
            json.dump(res, f, indent=1)
        os.replace(a.json + ".tmp", a.json)

    if "step" in parts:
        res["step"] = [run(a, seq, dtype=d) for d in dtypes for seq in (128, 512)]
        save()
    if "layer" in parts:
        res["layer"] = []
        for seq in (128, 512):
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "timing.json")
                r = run(a, seq, timing=path, steps=8)
                if os.path.exists(path):
                    f, b = layer_ms(path)
                    r["layer_fwd_ms"], r["layer_bwd_ms"] = f, b
                    if f is not None and b is not None:
                        r["layer_fwdbwd_ms"] = f + b
                        print(f"  layer seq {seq}: fwd {f:.3f} ms + bwd {b:.3f} ms = {f + b:.3f} ms", flush=True)
                    sp = step_split(path)
                    if sp:
                        r["split"] = sp
                        print(f"  step seq {seq} (eager, timed regions): {sp['step_ms']:.2f} ms = GEMMs {sp['gemm_ms']:.2f} "
                              f"(at {sp['gemm_frac_of_measured_peak'] or 0:.2f} of the measured cuBLASLt peak) + attention "
                              f"{sp['attention_ms']:.2f} + optimizer {sp['optimizer_ms']:.2f} + the rest {sp['other_ms']:.2f}",
                              flush=True)
                res["layer"].append(r)
        save()
    if "flags" in parts:
        res["flags"] = [run(a, 512)] + [run(a, 512, extra=[f]) for f in FLAGS] + [run(a, 512, extra=FLAGS)]
        save()
    if "maxbatch" in parts:
        res["maxbatch"] = {}
        for name, extra in (("no flags", []), ("all three flags", FLAGS)):
            lo, hi = run(a, 512, 16, extra, steps=8), run(a, 512, 48, extra, steps=8)
            entry = {"fit_runs": [lo, hi]}
            if "peak_gb" in lo and "peak_gb" in hi:
                per = (hi["peak_gb"] - lo["peak_gb"]) / (48 - 16)
                base = lo["peak_gb"] - per * 16
                pred = int((a.mem_cap_gb - base) // per)
                entry.update(per_sample_gb=per, fixed_gb=base, predicted=pred)
                ok = run(a, 512, pred, extra, steps=6)
                above = run(a, 512, pred + 1, extra, steps=6)
                entry["confirm"] = [ok, above]
                fits = lambda r: "peak_gb" in r and r["peak_gb"] <= a.mem_cap_gb
                entry["largest"] = pred if fits(ok) and not fits(above) else None
                print(f"  maxbatch {name}: {per:.3f} GB/sample + {base:.2f} GB -> {pred} "
                      f"(confirmed: {entry['largest'] is not None})", flush=True)
            res["maxbatch"][name] = entry
            save()
        mb = res["maxbatch"]
        if all(mb[k].get("largest") for k in mb):
            res["maxbatch_ratio"] = mb["all three flags"]["largest"] / mb["no flags"]["largest"]
    save()
    print("\n| run | ms/step | samples/s | peak GB |\n|---|---:|---:|---:|")
    for key in ("step", "flags"):
        for r in res.get(key, []):
            if "step_s" in r:
                print(f"| {r['dtype']} seq {r['seq']} x {r['batch']} {' '.join(r['flags']) or ''} | {r['step_s'] * 1e3:.2f} | "
                      f"{r['samples_s']:.1f} | {r['peak_gb']:.2f} |")
    for r in res.get("layer", []):
        if "layer_fwdbwd_ms" in r:
            print(f"| one layer fwd+bwd, seq {r['seq']} x {r['batch']} (timing report, eager) | "
                  f"{r['layer_fwdbwd_ms']:.3f} | | |")
    if "maxbatch_ratio" in res:
        print(f"maxbatch at seq 512 under {a.mem_cap_gb} GB: "
              f"{res['maxbatch']['no flags']['largest']} -> {res['maxbatch']['all three flags']['largest']} "
              f"({res['maxbatch_ratio']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
