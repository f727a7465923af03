#!/usr/bin/env bash
# End to end for issue 9 through the `cutrain` binary.
#   cpu:  checkpoints saved with CUTRAIN_CHECKPOINT_IO=plain and =aio are byte-identical, a resume
#         from the aio one replays the same losses, a bad value of the variable is an error naming it.
#   cuda: configs/bf16_full_nvme_optimizer.json (nvme_path pointed at a temp folder) trains with the
#         same losses as configs/bf16_full.json, prints the offload line, leaves no swap files; a
#         missing nvme_path folder is an error naming the key. (exits 77 = skipped without a GPU)
#   nvme_cli.sh CUTRAIN_BINARY cpu|cuda
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu
small_size
common=(--device "$device" "${size[@]}" --warmup_steps 2 --log_interval 1 --fixed_batch --learning_rate 1e-2 --seed 7)

if [ "$device" = cpu ]; then
  for io in plain aio; do
    CUTRAIN_CHECKPOINT_IO=$io "$bin" train --deepspeed_config configs/baseline.json "${common[@]}" --num_steps 4 \
        --save "$tmp/ckpt_$io" >"$tmp/save_$io.txt" 2>&1 || { cat "$tmp/save_$io.txt"; fail "save with $io"; }
  done
  for f in model.safetensors optimizer.safetensors trainer_state.json config.json manifest.json; do
    cmp -s "$tmp/ckpt_plain/global_step4/$f" "$tmp/ckpt_aio/global_step4/$f" \
      || fail "$f differs between CUTRAIN_CHECKPOINT_IO=plain and aio"
  done
  # Resume from the aio checkpoint (read through aio) and through plain: the same losses.
  for io in aio plain; do
    CUTRAIN_CHECKPOINT_IO=$io "$bin" train --deepspeed_config configs/baseline.json "${common[@]}" --num_steps 6 \
        --resume "$tmp/ckpt_aio" --loss_log_file "$tmp/resume_$io.csv" >"$tmp/resume_$io.txt" 2>&1 \
      || { cat "$tmp/resume_$io.txt"; fail "resume with $io"; }
  done
  cmp -s "$tmp/resume_aio.csv" "$tmp/resume_plain.csv" || fail "resumed losses differ between the read paths"
  [ "$(wc -l <"$tmp/resume_aio.csv")" -ge 2 ] || fail "resume wrote no losses"
  if CUTRAIN_CHECKPOINT_IO=turbo "$bin" train --deepspeed_config configs/baseline.json "${common[@]}" --num_steps 1 \
      --save "$tmp/ckpt_bad" >"$tmp/bad_io.txt" 2>&1; then fail "CUTRAIN_CHECKPOINT_IO=turbo accepted"; fi
  grep -q "CUTRAIN_CHECKPOINT_IO=turbo" "$tmp/bad_io.txt" || { cat "$tmp/bad_io.txt"; fail "bad CUTRAIN_CHECKPOINT_IO message"; }
  echo "PASS"
  exit 0
fi

mkdir -p "$tmp/nvme"
python3 - configs/bf16_full_nvme_optimizer.json "$tmp/swap.json" "$tmp/nvme" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"]["offload_optimizer"]["nvme_path"] = sys.argv[3]
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
"$bin" train --deepspeed_config configs/bf16_full.json "${common[@]}" --num_steps 6 --loss_log_file "$tmp/resident.csv" \
    >"$tmp/resident.txt" 2>&1 || { cat "$tmp/resident.txt"; fail "resident run"; }
"$bin" train --deepspeed_config "$tmp/swap.json" "${common[@]}" --num_steps 6 --loss_log_file "$tmp/swap.csv" \
    >"$tmp/swap.txt" 2>&1 || { cat "$tmp/swap.txt"; fail "nvme swap run"; }
grep -q "offload_optimizer: optim_states.exp_avg, optim_states.exp_avg_sq (.*) live in files under $tmp/nvme between steps" \
  "$tmp/swap.txt" || { cat "$tmp/swap.txt"; fail "offload line"; }
cmp -s "$tmp/resident.csv" "$tmp/swap.csv" || { paste "$tmp/resident.csv" "$tmp/swap.csv"; fail "losses differ with the NVMe swap"; }
[ -z "$(ls -A "$tmp/nvme")" ] || { ls -l "$tmp/nvme"; fail "swap files left behind"; }
python3 - "$tmp/swap.json" "$tmp/missing.json" "$tmp/no_such_folder" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"]["offload_optimizer"]["nvme_path"] = sys.argv[3]
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
if "$bin" train --deepspeed_config "$tmp/missing.json" "${common[@]}" --num_steps 1 >"$tmp/missing.txt" 2>&1; then
  fail "a missing nvme_path folder was accepted"
fi
grep -q "zero_optimization.offload_optimizer.nvme_path" "$tmp/missing.txt" || { cat "$tmp/missing.txt"; fail "missing folder message"; }
grep -q "no_such_folder" "$tmp/missing.txt" || { cat "$tmp/missing.txt"; fail "missing folder message names the path"; }
echo "PASS"
