#!/usr/bin/env bash
# End to end, data parallel: `cutrain launch --num_gpus 2 -- cutrain train` with ZeRO stages 0, 1,
# 2 and 3 against the single-process run of the same job. Random data (the default) is the same
# on every rank, so with --fixed_batch every rank sees the same batch: the averaged gradient
# equals one rank's, and the losses must equal the single-GPU run's (exactly in exact arithmetic;
# checked to 1e-5). Stage 3 runs with the baseline config's stage3_param_persistence_threshold 0
# (every unit gathered before use) and once with a threshold that keeps every unit persistent.
# GPT-2 (its head tied to wte: the embedding unit gathered for the lookup and again for the head)
# at stage 3 likewise, against its own single-process run.
# Needs 2 GPUs and NCCL.
#   zero_cli.sh CUTRAIN_BINARY cpu|cuda     (exits 77 = skipped: cpu, or fewer than 2 GPUs)
source "$(dirname "$0")/e2e_lib.sh"
[ "$device" = cuda ] || { echo "data parallelism needs CUDA devices: skipped on cpu"; exit 77; }
if grep -q "no CUDA device" <<<"$("$bin" info 2>&1 || true)"; then echo "no CUDA device: skipped"; exit 77; fi
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
[ "${gpus:-0}" -ge 2 ] || { echo "needs 2 GPUs, found ${gpus:-0}: skipped"; exit 77; }
port=$((29600 + $$ % 1000))
size=(--hidden_dim 128 --num_heads 2 --num_layers 2 --vocab_size 1000 --seq_length 64 --batch_size 2
      --num_steps 8 --warmup_steps 2 --log_interval 1 --fixed_batch --learning_rate 1e-2 --seed 7)

config() {  # config STAGE [NAME THRESHOLD] -> a copy of configs/baseline.json with zero_optimization.stage = STAGE
  python3 - "$1" "$tmp/${2:-stage$1}.json" "${3:-}" <<'PY'
import json, sys
c = json.load(open("configs/baseline.json"))
c["zero_optimization"]["stage"] = int(sys.argv[1])
if sys.argv[3]:
    c["zero_optimization"]["stage3_param_persistence_threshold"] = int(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"))
PY
}

config 0
"$bin" train --deepspeed_config "$tmp/stage0.json" --device cuda "${size[@]}" --loss_log_file "$tmp/single.csv" \
    >"$tmp/single.txt" 2>&1 || { cat "$tmp/single.txt"; fail "single-process run"; }
single=$tmp/single.csv

run_dp() {  # run_dp STAGE NAME: 2 ranks with $tmp/NAME.json against the single-process losses ($single)
  local stage=$1 name=$2 out=$tmp/dp$2.txt
  # Per-rank loss file names: the launcher passes one command line to every rank.
  "$bin" launch --num_gpus 2 --master_port $port -- bash -c \
      'exec "$0" train --deepspeed_config "$1" --device cuda "${@:3}" --loss_log_file "$2.r$RANK.csv"' \
      "$bin" "$tmp/$name.json" "$tmp/dp$name" "${size[@]}" >"$out" 2>&1 || { cat "$out"; fail "$name run"; }
  for r in 0 1; do
    grep -q "^\[Rank $r\] ZeRO stage $stage, world size 2: " "$out" || { cat "$out"; fail "$name: rank $r memory line"; }
  done
  if [ $stage -eq 1 ] || [ $stage -eq 2 ]; then
    grep -q "(master 4 + moments 8)/2 bytes/param = 10.00" "$out" || fail "$name: partitioned bytes/param"
  fi
  if [ $stage -eq 3 ]; then
    grep -q "params 2/2 + grads 2 + grad shard 2/2 + (master 4 + moments 8)/2 bytes/param = 10.00, plus 2 gather buffers" \
        "$out" || { cat "$out"; fail "$name: sharded bytes/param"; }
  fi
  # Rank 0 alone writes the loss log (train_loop.cpp); the other ranks' files must not exist.
  [ ! -e "$tmp/dp$name.r1.csv" ] || fail "$name: rank 1 wrote a loss log"
  python3 - "$single" "$tmp/dp$name.r0.csv" <<'PY' || { cat "$out"; fail "$name: losses"; }
import csv, sys
runs = [[float(r["loss"]) for r in csv.DictReader(open(p))] for p in sys.argv[1:]]
assert len(runs[0]) == 8 and all(len(r) == 8 for r in runs), runs
for a, b in zip(runs[0], runs[1]):
    assert abs(a - b) <= 1e-5 * max(1.0, abs(a)), ("data parallel != single process", runs[0], runs[1])
PY
  echo "ok: $name on 2 ranks = single process"
  port=$((port + 1))
}

for stage in 0 1 2 3; do
  config $stage
  run_dp $stage stage$stage
done
config 3 stage3_persistent 1000000000
run_dp 3 stage3_persistent

# GPT-2 at stage 3: every unit gathered (the head too, held beside the embedding unit), then the
# default threshold (the head, ln_f, resident).
size=(--model gpt2 "${size[@]}")
"$bin" train --deepspeed_config "$tmp/stage0.json" --device cuda "${size[@]}" --loss_log_file "$tmp/single_gpt2.csv" \
    >"$tmp/single_gpt2.txt" 2>&1 || { cat "$tmp/single_gpt2.txt"; fail "GPT-2 single-process run"; }
single=$tmp/single_gpt2.csv
config 3 gpt2_stage3
run_dp 3 gpt2_stage3
config 3 gpt2_stage3_head_resident 100000
run_dp 3 gpt2_stage3_head_resident
