#!/usr/bin/env bash
# LAMB end to end (configs/lamb.json: optimizer.type Lamb, ZeRO stage 0): a run trains (its loss
# falls on a fixed batch) and differs from the same run under AdamW; a run saved at step 3 and resumed
# reproduces the uninterrupted run's losses bit for bit; config.json records the optimizer and a
# resume under another optimizer.type is refused naming both; Lamb with ZeRO stage 3 and a Lamb
# parameter under AdamW are config errors naming the key; on the CPU, Lamb under the host launcher
# (data or pipeline parallel) is refused.
#   lamb_cli.sh CUTRAIN_BINARY cpu|cuda     (cuda: skipped without a GPU)
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu
small_size
run_flags=(--deepspeed_config configs/lamb.json --device "$device" --warmup_steps 1 --log_interval 1 --seed 5)
"$bin" train "${run_flags[@]}" "${size[@]}" --num_steps 6 --loss_log_file "$tmp/ref.csv" >"$tmp/ref.txt" 2>&1 \
  || { cat "$tmp/ref.txt"; fail "uninterrupted Lamb run"; }
# On a fixed batch the loss falls by more than 0.2 in 8 steps (as train_cli.sh asks of AdamW).
"$bin" train "${run_flags[@]}" "${size[@]}" --num_steps 8 --fixed_batch --learning_rate 1e-2 --loss_log_file "$tmp/fixed.csv" \
  >"$tmp/f.txt" 2>&1 || { cat "$tmp/f.txt"; fail "Lamb fixed-batch run"; }
awk -F, 'NR == 2 { first = $2 } NR > 1 { if ($2 != $2 + 0) bad = 1; last = $2 } END { exit !(!bad && last < first - 0.2) }' \
  "$tmp/fixed.csv" || { cat "$tmp/fixed.csv"; fail "Lamb: the loss on a fixed batch is not finite or does not fall"; }

# The same run under AdamW (the Lamb-only parameters removed): other losses.
python3 - "$tmp/adamw.json" <<'PY'
import json, sys
c = json.load(open("configs/lamb.json"))
c["optimizer"] = {"type": "AdamW", "params": {"lr": c["optimizer"]["params"]["lr"], "weight_decay": 0.01}}
json.dump(c, open(sys.argv[1], "w"))
PY
"$bin" train --deepspeed_config "$tmp/adamw.json" --device "$device" --warmup_steps 1 --log_interval 1 --seed 5 \
  "${size[@]}" --num_steps 6 --loss_log_file "$tmp/adamw.csv" >"$tmp/a.txt" 2>&1 || { cat "$tmp/a.txt"; fail "AdamW run"; }
cmp -s <(tail -n +3 "$tmp/ref.csv") <(tail -n +3 "$tmp/adamw.csv") && fail "Lamb and AdamW gave the same losses"

# Saves at steps 3 and 6; the save of step 3 resumed to 6: the same losses.
"$bin" train "${run_flags[@]}" "${size[@]}" --num_steps 6 --save "$tmp/ck" --save_interval 3 --loss_log_file "$tmp/saved.csv" \
  >"$tmp/s.txt" 2>&1 || { cat "$tmp/s.txt"; fail "Lamb run with --save"; }
cmp -s "$tmp/ref.csv" "$tmp/saved.csv" || fail "saving changed the losses"
grep -q '"optimizer": "Lamb"' "$tmp/ck/global_step3/config.json" || { cat "$tmp/ck/global_step3/config.json"; fail "config.json: optimizer"; }
"$bin" train "${run_flags[@]}" --batch_size 2 --num_steps 3 --resume "$tmp/ck/global_step3" --loss_log_file "$tmp/res.csv" \
  >"$tmp/r.txt" 2>&1 || { cat "$tmp/r.txt"; fail "Lamb resume"; }
grep -q "Resumed from $tmp/ck/global_step3 at step 3$" "$tmp/r.txt" || { cat "$tmp/r.txt"; fail "resumed line"; }
diff <(awk -F, 'NR > 1 && $1 >= 3' "$tmp/ref.csv") <(tail -n +2 "$tmp/res.csv") >/dev/null \
  || { paste -d' ' "$tmp/ref.csv" "$tmp/res.csv"; fail "resumed Lamb losses differ from the uninterrupted run"; }

# A resume under AdamW is refused, naming both optimizers.
if "$bin" train --deepspeed_config "$tmp/adamw.json" --device "$device" --batch_size 2 --num_steps 1 --resume "$tmp/ck" >"$tmp/x.txt" 2>&1; then
  cat "$tmp/x.txt"; fail "a Lamb checkpoint resumed under AdamW"
fi
grep -q "optimizer: the checkpoint holds the state of optimizer Lamb, this run's optimizer.type is AdamW" "$tmp/x.txt" \
  || { cat "$tmp/x.txt"; fail "the optimizer mismatch message"; }

# Config errors.
python3 - "$tmp/z3.json" "$tmp/coeff.json" <<'PY'
import json, sys
c = json.load(open("configs/lamb.json"))
c["zero_optimization"] = {"stage": 3}
json.dump(c, open(sys.argv[1], "w"))
c = json.load(open("configs/lamb.json"))
c["optimizer"]["type"] = "AdamW"
del c["optimizer"]["params"]["bias_correction"]
json.dump(c, open(sys.argv[2], "w"))
PY
"$bin" check-config "$tmp/z3.json" >"$tmp/c.txt" 2>&1 && { cat "$tmp/c.txt"; fail "Lamb with ZeRO stage 3 accepted"; }
grep -q "zero_optimization.stage: optimizer type Lamb needs ZeRO stage 0, found stage 3" "$tmp/c.txt" || { cat "$tmp/c.txt"; fail "z3 message"; }
"$bin" check-config "$tmp/coeff.json" >"$tmp/c.txt" 2>&1 && { cat "$tmp/c.txt"; fail "max_coeff under AdamW accepted"; }
grep -q "optimizer.params.max_coeff: max_coeff is a parameter of type Lamb; type is AdamW" "$tmp/c.txt" || { cat "$tmp/c.txt"; fail "coeff message"; }
# The CPU backend's data parallelism and pipeline update with AdamW: Lamb is refused there, naming it.
if [ "$device" = cpu ]; then
  if "$bin" launch --backend host --num_procs 2 --master_port "$(free_port)" -- "$bin" train "${run_flags[@]}" \
      "${size[@]}" --num_steps 1 >"$tmp/dp.txt" 2>&1; then
    cat "$tmp/dp.txt"; fail "Lamb with the CPU backend's data parallelism accepted"
  fi
  grep -q "optimizer.type Lamb runs on one process" "$tmp/dp.txt" || { cat "$tmp/dp.txt"; fail "Lamb x data parallel message"; }
  if "$bin" launch --backend host --num_procs 2 --master_port "$(free_port)" -- "$bin" train "${run_flags[@]}" \
      "${size[@]}" --num_steps 1 --pipeline_parallel_size 2 >"$tmp/pp.txt" 2>&1; then
    cat "$tmp/pp.txt"; fail "Lamb with a pipeline accepted"
  fi
  grep -q "gives optimizer.type Lamb, whose trust ratios need whole tensors" "$tmp/pp.txt" || { cat "$tmp/pp.txt"; fail "Lamb x pipeline message"; }
fi
echo "ok: Lamb trains, differs from AdamW, resumes equal, refuses another optimizer and bad configs"
