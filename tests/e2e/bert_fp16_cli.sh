#!/usr/bin/env bash
# fp16 BERT pre-training end to end (docs/bert.md, docs/training.md "fp16 training"): a tiny BERT
# with LAMB under configs/bert_tiny_lamb_fp16.json (dynamic loss scaling) on masked-LM batches cut
# from small token shards (bert_cli.sh's): the loss is finite and falls over 20 steps, every Step line and metrics line carries the
# loss scale; DeepSpeedTransformerConfig's fp16: true selects fp16 under a config without bf16;
# a scale far too large (initial_scale_power 30) overflows: each overflow is logged with the scale
# halving and the step skipped, until the scale fits; the dynamic scaler resumes from a checkpoint
# where it was; an overflow at min_loss_scale stops the run
# with an error naming fp16.min_loss_scale and the step. On cpu: fp16 is refused (the CPU backend
# computes in fp32).
#   bert_fp16_cli.sh CUTRAIN_BINARY cpu|cuda     (cuda: skipped without a GPU)
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu

if [ "$device" = cpu ]; then
  if "$bin" train --model bert --bert_config configs/bert_tiny.json --deepspeed_config configs/bert_tiny_lamb_fp16.json \
      --device cpu --num_steps 1 >"$tmp/cpu.txt" 2>&1; then cat "$tmp/cpu.txt"; fail "fp16 trained on the CPU backend"; fi
  grep -qF "fp16.enabled: true with --device cpu: the CPU backend computes in fp32" "$tmp/cpu.txt" \
    || { cat "$tmp/cpu.txt"; fail "the CPU refusal's message"; }
  echo "ok: fp16 refused on the CPU backend"
  exit 0
fi

# Shards as bert_cli.sh's: documents walking a small cycle of token ids (masked tokens predictable).
python3 - "$tmp" <<'PY'
import random, struct, sys
def shard(path, n_docs, seed):
    rng = random.Random(seed)
    toks = []
    for _ in range(n_docs):
        start, step = rng.randrange(200), rng.choice([1, 2, 3])
        toks += [(start + step * i) % 200 + 100 for i in range(rng.randrange(5, 61))] + [50256]
    header = [20240520, 1, len(toks)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack(f"<{len(toks)}H", *toks))
shard(sys.argv[1] + "/train_000.bin", 300, 1)
shard(sys.argv[1] + "/train_001.bin", 300, 2)
PY

# The tiny model on the GPU: head_dim 64 (hidden 128, 2 heads), as attention needs.
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
c = json.load(open("configs/bert_tiny.json"))
c.update(hidden_size=128, heads=2, intermediate_size=512)
json.dump(c, open(d + "/model.json", "w"))
c["fp16"] = True
json.dump(c, open(d + "/model_fp16.json", "w"))
ds = json.load(open("configs/bert_tiny_lamb_fp16.json"))
nobf = dict(ds)
del nobf["fp16"]
json.dump(nobf, open(d + "/no_precision.json", "w"))
over = json.loads(json.dumps(ds))
over["fp16"]["initial_scale_power"] = 30  # dlogits * 2^30 overflow fp16 at once
json.dump(over, open(d + "/overflow.json", "w"))
stop = json.loads(json.dumps(over))
stop["fp16"].update(min_loss_scale=2 ** 30, hysteresis=1)  # the first overflow is at the floor
json.dump(stop, open(d + "/stop.json", "w"))
PY
common=(--model bert --device cuda --max_seq_length 64 --warmup_steps 1 --log_interval 1 --seed 42 --use_real_data
        --data "$tmp/train_*.bin")
flags=("${common[@]}" --bert_config "$tmp/model.json")

# 20 steps with dynamic loss scaling: the loss is finite and falls; the scale is in every line.
"$bin" train "${flags[@]}" --deepspeed_config configs/bert_tiny_lamb_fp16.json --num_steps 20 \
  --loss_log_file "$tmp/l.csv" --metrics_file "$tmp/m.jsonl" >"$tmp/l.txt" 2>&1 || { cat "$tmp/l.txt"; fail "fp16 run"; }
python3 - "$tmp/l.csv" "$tmp/m.jsonl" <<'PY' || { cat "$tmp/l.txt"; fail "fp16 loss not finite, not falling, or no loss_scale"; }
import csv, json, math, sys
l = [float(r["loss"]) for r in csv.DictReader(open(sys.argv[1]))]
assert len(l) == 20 and all(math.isfinite(x) for x in l), l
assert sum(l[-5:]) / 5 < sum(l[:5]) / 5 - 0.5, l
m = [json.loads(x) for x in open(sys.argv[2])]
assert len(m) == 20 and all(x["loss_scale"] > 0 for x in m), m
assert m[0]["loss_scale"] == 65536, m[0]
PY
grep -q "Step 0: loss=.*loss_scale=65536" "$tmp/l.txt" || { cat "$tmp/l.txt"; fail "the Step line's loss_scale"; }
grep -q "fp16 (dynamic loss scale)" "$tmp/l.txt" || { cat "$tmp/l.txt"; fail "the device line does not say fp16"; }

# fp16: true in the model config selects fp16 under a DeepSpeed config without a precision block.
"$bin" train "${common[@]}" --bert_config "$tmp/model_fp16.json" --deepspeed_config "$tmp/no_precision.json" \
  --num_steps 2 >"$tmp/sel.txt" 2>&1 || { cat "$tmp/sel.txt"; fail "fp16 from the model config"; }
grep -q "bert_config fp16: true: fp16 training" "$tmp/sel.txt" || { cat "$tmp/sel.txt"; fail "selection line"; }
grep -q "loss_scale=65536" "$tmp/sel.txt" || { cat "$tmp/sel.txt"; fail "fp16 from the model config: no loss scale"; }

# Overflow: scale 2^30 overflows; each overflow is logged and skipped (hysteresis 2: the first keeps
# the scale), until the scale fits and the loss is finite.
"$bin" train "${flags[@]}" --deepspeed_config "$tmp/overflow.json" --num_steps 30 --metrics_file "$tmp/o.jsonl" \
  >"$tmp/o.txt" 2>&1 || { cat "$tmp/o.txt"; fail "overflow run"; }
grep -qF "[fp16] overflow at step 0: loss scale 1073741824 -> 1073741824, step skipped" "$tmp/o.txt" \
  || { cat "$tmp/o.txt"; fail "first overflow (hysteresis)"; }
grep -qF "[fp16] overflow at step 1: loss scale 1073741824 -> 536870912, step skipped" "$tmp/o.txt" \
  || { cat "$tmp/o.txt"; fail "second overflow halves the scale"; }
python3 - "$tmp/o.jsonl" <<'PY' || { cat "$tmp/o.txt"; fail "overflow metrics"; }
import json, math, sys
m = [json.loads(x) for x in open(sys.argv[1])]
assert m[0]["skipped"] and m[1]["skipped"] and m[1]["loss_scale"] == 2 ** 30 and m[2]["loss_scale"] == 2 ** 29, m[:3]
assert sum(not x["skipped"] for x in m[-10:]) >= 5 and m[-1]["loss_scale"] < 2 ** 20, m[-10:]
assert all(math.isfinite(x["loss"]) for x in m), m
PY

# The dynamic scaler is in the checkpoint: a run saved at step 6 of the overflow config and resumed
# continues with the scale (and hysteresis) it had, so its losses and scales equal the
# uninterrupted run's; a resume that started again at 2^30 would overflow and skip its first steps.
"$bin" train "${flags[@]}" --deepspeed_config "$tmp/overflow.json" --num_steps 12 --metrics_file "$tmp/ref12.jsonl" \
  >"$tmp/ref12.txt" 2>&1 || { cat "$tmp/ref12.txt"; fail "overflow run, 12 steps"; }
"$bin" train "${flags[@]}" --deepspeed_config "$tmp/overflow.json" --num_steps 6 --save "$tmp/ck" --save_interval 6 \
  >"$tmp/save6.txt" 2>&1 || { cat "$tmp/save6.txt"; fail "overflow run with --save"; }
"$bin" train "${flags[@]}" --deepspeed_config "$tmp/overflow.json" --num_steps 6 --resume "$tmp/ck/global_step6" \
  --metrics_file "$tmp/res6.jsonl" >"$tmp/res6.txt" 2>&1 || { cat "$tmp/res6.txt"; fail "fp16 resume"; }
grep -q "fp16 loss scale resumed at " "$tmp/res6.txt" || { cat "$tmp/res6.txt"; fail "the resume's loss scale line"; }
python3 - "$tmp/ref12.jsonl" "$tmp/res6.jsonl" "$tmp/ck/global_step6/trainer_state.json" <<'PY' \
  || { cat "$tmp/res6.txt"; fail "the resumed fp16 run differs from the uninterrupted one"; }
import json, sys
ref = [json.loads(x) for x in open(sys.argv[1])]
res = [json.loads(x) for x in open(sys.argv[2])]
ls = json.load(open(sys.argv[3]))["loss_scaler"]
assert set(ls) == {"cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"}, ls
assert ls["cur_scale"] == ref[6]["loss_scale"] and ls["cur_iter"] == 6, (ls, ref[6])
assert len(res) == 6, res
for a, b in zip(ref[6:], res):
    assert a["step"] == b["step"] and a["loss_scale"] == b["loss_scale"] and a["skipped"] == b["skipped"], (a, b)
    assert a["loss"] == b["loss"], (a, b)
PY
# An overflow at min_loss_scale (hysteresis 1): the run stops naming the key and the step.
if "$bin" train "${flags[@]}" --deepspeed_config "$tmp/stop.json" --num_steps 3 >"$tmp/s.txt" 2>&1; then
  cat "$tmp/s.txt"; fail "an overflow at min_loss_scale did not stop the run"
fi
grep -qF "train: fp16 overflow at step 0: " "$tmp/s.txt" || { cat "$tmp/s.txt"; fail "the stop names the step"; }
grep -qF "fp16.min_loss_scale" "$tmp/s.txt" || { cat "$tmp/s.txt"; fail "the stop names fp16.min_loss_scale"; }
echo "ok: fp16 BERT trains with dynamic loss scaling, overflows skip and halve, min_loss_scale stops the run"
