#!/usr/bin/env python3
"""DeepSpeed's Data Efficiency pieces beside cutrain's, on the same schedules and shapes (issue #21's
peer). Run through ../shared/peers/run.sh ds-python (DeepSpeed 0.19.8):

    run.sh ds-python bench/peers/data_efficiency_peer.py --results DIR [--out FILE.json] [--quick]

1. Schedules. DIR is a results folder of scripts/data_efficiency_quality.py: for each variant, its
   DeepSpeed config (DIR/configs/<variant>.json) and cutrain's per-step metrics
   (DIR/<variant>_metrics.jsonl). DeepSpeed's own schedulers are driven as its engine and data
   sampler drive them, and every step's value must equal cutrain's:
   - curriculum (vocabularyrarity, seqlen_truncate): deepspeed.runtime.data_pipeline.curriculum_scheduler.
     CurriculumScheduler(metric config).update_difficulty(s + 1) for optimizer step s (the data
     sampler counts its batches from 1) against the rows' curriculum_difficulty / curriculum_seqlen;
   - random-LTD: deepspeed.runtime.data_pipeline.data_routing.scheduler.RandomLTDScheduler
     .update_seq(s) (the engine passes global_steps before the step), get_current_seq() against
     random_ltd_kept, and its consumed_layer_tokens against cutrain's (DeepSpeed counts the blocks
     that do not drop at max_value, cutrain at the sequence length: the same here, max_value = S).
     Composed with seqlen_truncate, DeepSpeed's layer keeps min(get_current_seq(), the truncated
     length) (RandomLayerTokenDrop.forward drops only while reserved_length < curr_seq), which is
     what random_ltd_kept is compared with; the layer tokens are not (DeepSpeed's scheduler counts
     the full lengths, cutrain the real ones).
2. The token gather / scatter: DeepSpeed's random_ltd op (deepspeed.ops.random_ltd: token_gather,
   token_scatter_, a JIT build of csrc/random_ltd; its 2-byte path is __half, which moves bf16
   bits unchanged), and PyTorch's index ops (torch.gather / scatter_) at bench/bench_token_drop.cu's
   shapes, each checked against indexing first; rows named as bench_token_drop's with "@deepspeed" /
   "@torch" (bench/peers/compare.py joins them). The JIT build can fail: the error is printed and
   recorded, the PyTorch rows still run. Indices come from DeepSpeed's gpt_sample_tokens (multinomial
   + its token_sort_) when the op builds, else from a sorted randperm.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_util import time_us  # noqa: E402

SHAPES = [(8, 1024, 768), (4, 512, 1024)]  # (B, S, H) as bench_token_drop: K = S/2 and S/4


def curriculum_checks(results):
    from deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler
    from deepspeed.runtime.data_pipeline.data_routing.scheduler import RandomLTDScheduler
    checks = []
    cfg_dir = os.path.join(results, "configs")
    for name in sorted(os.listdir(cfg_dir)):
        variant = name[:-len(".json")]
        metrics = os.path.join(results, variant + "_metrics.jsonl")
        if not os.path.exists(metrics):
            continue
        cfg = json.load(open(os.path.join(cfg_dir, name)))
        rows = [json.loads(l) for l in open(metrics) if l.strip()]
        de = cfg.get("data_efficiency", {})
        metrics_cfg = de.get("data_sampling", {}).get("curriculum_learning", {}).get("curriculum_metrics", {})
        for metric, key in (("vocabularyrarity", "curriculum_difficulty"), ("seqlen_truncate", "curriculum_seqlen")):
            if metric not in metrics_cfg:
                continue
            sched = CurriculumScheduler(metrics_cfg[metric])
            ours = [r[key] for r in rows]
            theirs = [sched.update_difficulty(r["step"] + 1) for r in rows]
            checks.append(compare(variant, f"{metric} ({metrics_cfg[metric]['schedule_type']})", rows, ours, theirs))
        ltd = de.get("data_routing", {}).get("random_ltd")
        if ltd and ltd.get("enabled"):
            global_batch = cfg["train_micro_batch_size_per_gpu"] * cfg.get("gradient_accumulation_steps", 1)
            sched = RandomLTDScheduler({**ltd, "global_batch_size": global_batch,
                                        "layer_token_lr_schedule": {"enabled": False}})
            ours, theirs, ours_lt, theirs_lt = [], [], [], []
            truncated = "seqlen_truncate" in metrics_cfg
            for r in rows:
                sched.update_seq(r["step"])
                seq = sched.get_current_seq()
                theirs.append(min(seq, r["curriculum_seqlen"]) if truncated else seq)
                ours.append(r["random_ltd_kept"])
                theirs_lt.append(sched.state["consumed_layer_tokens"])
                ours_lt.append(r["consumed_layer_tokens"])
            checks.append(compare(variant, "random-LTD kept tokens (fixed_linear" +
                                  (", at most the truncated length)" if truncated else ")"), rows, ours, theirs))
            if not truncated:
                checks.append(compare(variant, "random-LTD consumed_layer_tokens", rows, ours_lt, theirs_lt))
    return checks


def compare(variant, what, rows, ours, theirs):
    bad = [(r["step"], a, b) for r, a, b in zip(rows, ours, theirs) if a != b]
    c = {"variant": variant, "schedule": what, "steps": len(rows), "mismatches": len(bad),
         "first_mismatch": list(bad[0]) if bad else None, "first": ours[0] if ours else None,
         "last": ours[-1] if ours else None}
    print(f"| {variant} | {what} | {len(rows)} | {len(bad)} | "
          f"{'-' if not bad else f'step {bad[0][0]}: cutrain {bad[0][1]}, DeepSpeed {bad[0][2]}'} |", flush=True)
    return c


def ops_rows(iters, rows):
    """Appends the timed rows to rows (kept when a later shape fails); returns the JIT build's error."""
    jit_error, mod = None, None
    try:
        from deepspeed.ops.op_builder import RandomLTDBuilder
        mod = RandomLTDBuilder().load()
    except Exception as e:  # the JIT build (nvcc, ninja, the arch list) may fail on a machine
        jit_error = f"{type(e).__name__}: {e}"
        print(f"DeepSpeed random_ltd op: not built ({jit_error[:300]}); PyTorch rows only", flush=True)
    torch.manual_seed(0)
    for B, S, H in SHAPES:
        for K in (S // 2, S // 4):
            shape = f"B{B}S{S}K{K}H{H}"
            x = torch.randn(B, S, H, device="cuda", dtype=torch.float16)
            if mod is not None:
                from deepspeed.ops.random_ltd import gpt_sample_tokens
                idx = gpt_sample_tokens(K, S, B, layers=1, device="cuda")[0][0].contiguous()
            else:
                idx = torch.stack([torch.randperm(S, device="cuda")[:K].sort().values for _ in range(B)]).to(torch.int32)
            assert bool((idx[:, 1:] > idx[:, :-1]).all()), "indices not sorted and distinct"
            lidx = idx.long()
            ref = x[torch.arange(B, device="cuda")[:, None], lidx]
            expand = lidx[:, :, None].expand(B, K, H)
            kept = torch.randn(B, K, H, device="cuda", dtype=torch.float16)
            full = x.clone()
            ref_s = x.clone()
            ref_s[torch.arange(B, device="cuda")[:, None], lidx] = kept
            torch_g = lambda: torch.gather(x, 1, expand)
            torch_s = lambda: full.scatter_(1, expand, kept)
            assert torch.equal(torch_g(), ref) and torch.equal(torch_s(), ref_s), "torch index ops"
            rows.append({"name": f"token_gather/fwd/{shape}@torch", "time_us": time_us(torch_g, iters)})
            rows.append({"name": f"token_scatter/fwd/{shape}@torch", "time_us": time_us(torch_s, iters)})
            if mod is not None:
                ds_g = lambda: mod.token_gather(x, idx, True)
                full2 = x.clone()
                ds_s = lambda: mod.token_scatter_(full2, kept, idx, True)
                assert torch.equal(ds_g(), ref), "DeepSpeed token_gather != indexing"
                assert torch.equal(ds_s(), ref_s), "DeepSpeed token_scatter_ != indexing"
                rows.append({"name": f"token_gather/fwd/{shape}@deepspeed", "time_us": time_us(ds_g, iters)})
                rows.append({"name": f"token_scatter/fwd/{shape}@deepspeed", "time_us": time_us(ds_s, iters)})
            for r in rows[-(4 if mod is not None else 2):]:
                print(f"{r['name']:48s} {r['time_us']:10.2f} us", flush=True)
    return jit_error


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True, help="a results folder of scripts/data_efficiency_quality.py")
    ap.add_argument("--out", default="")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if not os.path.isdir(os.path.join(a.results, "configs")):
        sys.exit(f"data_efficiency_peer: --results: expected a folder with configs/, found '{a.results}'")
    import deepspeed
    print(f"DeepSpeed {deepspeed.__version__}, PyTorch {torch.__version__}")
    print("| variant | schedule (DeepSpeed's scheduler against cutrain's metrics) | steps | mismatches | first |")
    print("|---|---|---:|---:|---|")
    checks = curriculum_checks(a.results)
    equal = bool(checks) and all(c["mismatches"] == 0 for c in checks)
    print(f"schedules equal to DeepSpeed's at every step: {'yes' if equal else 'NO'} ({len(checks)} schedules)", flush=True)
    rows, jit_error, ops_error = [], "no CUDA device", None
    if torch.cuda.is_available():
        try:
            jit_error = ops_rows(10 if a.quick else 50, rows)
        except Exception as e:  # a result check that failed, or a launch error: recorded with the rows so far
            ops_error = f"{type(e).__name__}: {e}"
            print(f"gather / scatter: {ops_error}", flush=True)
    doc = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
           "deepspeed": deepspeed.__version__, "schedules": checks, "schedules_equal": equal, "jit_error": jit_error,
           "ops_error": ops_error, "results": rows}
    if a.out:
        with open(a.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(a.out + ".tmp", a.out)
    sys.exit(0 if equal and ops_error is None else 1)


if __name__ == "__main__":
    main()
