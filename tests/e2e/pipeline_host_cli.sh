#!/usr/bin/env bash
# End to end, pipeline parallelism on the CPU backend: `cutrain launch --backend host --num_procs
# S -- cutrain train --device cpu --pipeline_parallel_size S` at 2 and 4 stages (partition_method
# parameters, uniform and type:TransformerBlock) against the single process over the same 8
# micro-batches per step (gradient_accumulation_steps 8): the same losses and the same checkpoint
# bytes (1F1B runs each stage's backwards in micro-batch order, so every gradient is accumulated
# in the single process's order; without gradient_clipping the norm's summation order changes
# nothing), the partition and bubble line, GPT-2 at 2 and 4 stages (the head tied to the
# embedding), data x pipeline grids (2 x 2, 2 x 4; ZeRO-1 at 2 x 2 and 4 x 2) against the single
# process with the same global batch, a single-process checkpoint resumed on 2 stages, and the bad
# input: a degree that does not divide the world size, more stages than layers, a type:REGEX
# without enough matches, ZeRO-2 with a pipeline, and the warning of a pipeline without gradient
# accumulation; pipeline.activation_checkpoint_interval (1 and 2, at 2 and 4 stages, GPT-2) against
# the same runs without (losses, checkpoint bytes, fewer activation bytes held), the config's
# pipeline section giving the degree, and the GPU engine's refusals (a degree above 1, an interval
# above 1, virtual stages on the CPU backend).
#   pipeline_host_cli.sh CUTRAIN_BINARY cpu|cuda   (the cuda variant exits 77: CPU backend only)
source "$(dirname "$0")/e2e_lib.sh"
[ "$device" = cuda ] && { echo "pipeline parallelism runs on the CPU backend: skipped on cuda"; exit 77; }
clear_launch_env
port=$(free_port)
size=(--device cpu --hidden_dim 32 --num_heads 2 --num_layers 4 --vocab_size 64 --seq_length 8 --batch_size 1
      --log_interval 1 --learning_rate 1e-2 --seed 7)
config() {  # config OUT ACCUM [STAGE]
  python3 - "$1" "$2" "${3:-0}" <<'PY'
import json, sys
c = json.load(open("configs/baseline.json"))
c["zero_optimization"]["stage"] = int(sys.argv[3])
c["train_micro_batch_size_per_gpu"] = 1
c["gradient_accumulation_steps"] = int(sys.argv[2])
json.dump(c, open(sys.argv[1], "w"))
PY
}
config "$tmp/a8.json" 8
config "$tmp/a1.json" 1
config "$tmp/z2.json" 8 2
pipe() {  # pipe STAGES OUT train-args...: S ranks through the host launcher
  local s=$1 out=$2; shift 2
  "$bin" launch --backend host --num_procs "$s" --master_port $port -- "$bin" train "${size[@]}" \
      --pipeline_parallel_size "$s" "$@" >"$out" 2>&1
  local rc=$?
  port=$(free_port)
  return $rc
}

"$bin" train "${size[@]}" --deepspeed_config "$tmp/a8.json" --num_steps 4 --loss_log_file "$tmp/single.csv" \
    --save "$tmp/ck_single" >"$tmp/single.txt" 2>&1 || { cat "$tmp/single.txt"; fail "single process"; }
for run in "2 parameters" "2 uniform" "4 type:TransformerBlock"; do
  set -- $run
  s=$1 method=$2 name=p$1_${2//[^a-z]/}
  pipe "$s" "$tmp/$name.txt" --deepspeed_config "$tmp/a8.json" --num_steps 4 --partition_method "$method" \
      --loss_log_file "$tmp/$name.csv" --save "$tmp/ck_$name" || { cat "$tmp/$name.txt"; fail "$name run"; }
  grep -q "^\[Rank 0\] pipeline: $s stages, partition_method $method: stage 0 = layers 0-" "$tmp/$name.txt" \
      || { cat "$tmp/$name.txt"; fail "$name: the partition line"; }
  for r in $(seq 0 $((s - 1))); do
    grep -q "^\[Rank $r\] pipeline stage $r of $s over the host" "$tmp/$name.txt" || fail "$name: rank $r's stage line"
  done
  same_losses "$tmp/single.csv" "$tmp/$name.csv" "pipeline" || { cat "$tmp/$name.txt"; fail "$name: losses"; }
  for f in model.safetensors optimizer.safetensors trainer_state.json; do
    cmp "$tmp/ck_single/global_step4/$f" "$tmp/ck_$name/global_step4/$f" || fail "$name: $f differs"
  done
  echo "ok: $s stages ($method) = the single process (losses, checkpoint bytes)"
done
# GPT-2: the head tied to the token embedding on the first and last stages. The tied weight's two
# gradients are summed in another order than one process's, so the checkpoint is compared within
# tolerance (tests/e2e/compare_checkpoints.py) and the losses within 1e-6.
gpt2=(--model gpt2)
"$bin" train "${size[@]}" "${gpt2[@]}" --deepspeed_config "$tmp/a8.json" --num_steps 4 --loss_log_file "$tmp/g1.csv" \
    --save "$tmp/ck_g1" >"$tmp/g1.txt" 2>&1 || { cat "$tmp/g1.txt"; fail "GPT-2 single process"; }
for s in 2 4; do
  pipe "$s" "$tmp/g$s.txt" "${gpt2[@]}" --deepspeed_config "$tmp/a8.json" --num_steps 4 --partition_method uniform \
      --loss_log_file "$tmp/g$s.csv" --save "$tmp/ck_g$s" || { cat "$tmp/g$s.txt"; fail "GPT-2 on $s stages"; }
  grep -q "tied: the token embedding is the head's weight on stages 0 and $((s - 1)), its gradients summed" \
      "$tmp/g$s.txt" || { cat "$tmp/g$s.txt"; fail "GPT-2: the tied line"; }
  same_losses "$tmp/g1.csv" "$tmp/g$s.csv" "pipeline" || { cat "$tmp/g$s.txt"; fail "GPT-2 on $s stages: losses"; }
  python3 tests/e2e/compare_checkpoints.py "$tmp/ck_g1/global_step4" "$tmp/ck_g$s/global_step4" \
      || fail "GPT-2 on $s stages: checkpoint"
  echo "ok: GPT-2 (tied head) on $s stages = the single process (losses, checkpoint)"
done

# Data x pipeline: 2 replicas x 2 stages (4 ranks) and 2 x 4 (8 ranks, GPT-2) with train_batch_size
# 8 (micro 1): each replica pipelines 4 micro-batches, the single process accumulates 8.
# ZeRO-1 (each replica keeps the moments of its partition of the stage) at 2 x 2 and 4 x 2.
for z in 0 1; do
  python3 - "$tmp/t8_z$z.json" $z <<'PY'
import json, sys
c = json.load(open("configs/baseline.json"))
c["zero_optimization"]["stage"] = int(sys.argv[2])
c["train_micro_batch_size_per_gpu"] = 1
c["train_batch_size"] = 8
c.pop("gradient_accumulation_steps")
json.dump(c, open(sys.argv[1], "w"))
PY
done
for run in "4 2 simple 0" "8 4 gpt2 0" "4 2 simple 1" "8 2 gpt2 1"; do
  set -- $run
  w=$1 s=$2 m=$3 z=$4 name=dp$1x$2_$3_z$4 dp=$(($1 / $2))
  "$bin" train "${size[@]}" --model "$m" --deepspeed_config "$tmp/t8_z0.json" --num_steps 4 \
      --loss_log_file "$tmp/${name}_1.csv" --save "$tmp/ck_${name}_1" >"$tmp/${name}_1.txt" 2>&1 \
      || { cat "$tmp/${name}_1.txt"; fail "$name: single process"; }
  "$bin" launch --backend host --num_procs "$w" --master_port $port -- "$bin" train "${size[@]}" --model "$m" \
      --deepspeed_config "$tmp/t8_z$z.json" --num_steps 4 --pipeline_parallel_size "$s" --loss_log_file "$tmp/$name.csv" \
      --save "$tmp/ck_$name" >"$tmp/$name.txt" 2>&1 || { cat "$tmp/$name.txt"; fail "$name run"; }
  port=$(free_port)
  grep -q "1F1B over $((8 / dp)) micro-batches.*; $dp data-parallel replicas (rank = stage x $dp + replica)" \
      "$tmp/$name.txt" || { cat "$tmp/$name.txt"; fail "$name: the grid line"; }
  want="^\[Rank $((w - 1))\] pipeline stage $((s - 1)) of $s, replica $((dp - 1)) of $dp"
  [ "$z" = 1 ] && want="$want, ZeRO-1: the moments of \["
  grep -q "$want" "$tmp/$name.txt" || { cat "$tmp/$name.txt"; fail "$name: the last rank's stage line"; }
  same_losses "$tmp/${name}_1.csv" "$tmp/$name.csv" "pipeline" || { cat "$tmp/$name.txt"; fail "$name: losses"; }
  python3 tests/e2e/compare_checkpoints.py "$tmp/ck_${name}_1/global_step4" "$tmp/ck_$name/global_step4" \
      || fail "$name: checkpoint"
  echo "ok: $m, $dp replicas x $s stages, ZeRO stage $z = the single process (losses, checkpoint)"
done

grep -q "1F1B over 8 micro-batches, predicted bubble fraction 0.273 ((S-1)/(M+S-1) = 3/11)" "$tmp"/p4_*.txt \
    || fail "the bubble fraction of 4 stages"

# The single process's checkpoint on 2 stages continues as the single process does.
"$bin" train "${size[@]}" --deepspeed_config "$tmp/a8.json" --num_steps 2 --resume "$tmp/ck_single" \
    --loss_log_file "$tmp/single_r.csv" >"$tmp/single_r.txt" 2>&1 || { cat "$tmp/single_r.txt"; fail "single resume"; }
pipe 2 "$tmp/pr.txt" --deepspeed_config "$tmp/a8.json" --num_steps 2 --resume "$tmp/ck_single" \
    --loss_log_file "$tmp/pr.csv" || { cat "$tmp/pr.txt"; fail "2-stage resume"; }
same_losses "$tmp/single_r.csv" "$tmp/pr.csv" "pipeline" || fail "resumed losses"
echo "ok: a single-process checkpoint resumed on 2 stages"

# No gradient accumulation: it runs, with the warning.
pipe 2 "$tmp/w.txt" --deepspeed_config "$tmp/a1.json" --num_steps 1 || { cat "$tmp/w.txt"; fail "accumulation 1"; }
grep -q "warning: a pipeline of 2 stages with gradient_accumulation_steps 1: one micro-batch per step, so no stage \
overlaps another (bubble fraction 1/2)" "$tmp/w.txt" || { cat "$tmp/w.txt"; fail "the accumulation warning"; }

# DeepSpeed's pipeline.activation_checkpoint_interval: each chunk of N of a stage's layers keeps its
# input only and is recomputed in backward: the same losses and checkpoint bytes as without (and as
# the single process), at 2 and 4 stages, intervals 1 and 2; the config's pipeline section giving
# the degree and the partition (no flag); fewer activation bytes held than without (run summary).
ckcfg() {  # ckcfg OUT INTERVAL [STAGES PARTITION]
  python3 - "$@" <<'PY'
import json, sys
c = json.load(open("configs/baseline.json"))
c["zero_optimization"]["stage"] = 0
c["train_micro_batch_size_per_gpu"] = 1
c["gradient_accumulation_steps"] = 8
c["pipeline"] = {"activation_checkpoint_interval": int(sys.argv[2])}
if len(sys.argv) > 3:
    c["pipeline"]["stages"] = int(sys.argv[3])
    c["pipeline"]["partition"] = sys.argv[4]
json.dump(c, open(sys.argv[1], "w"))
PY
}
held() { sed -n "s/.*pipeline stage 0: activations held at most [0-9.]* MiB (\([0-9]*\) bytes.*/\1/p" "$1"; }
for run in "2 1" "2 2" "4 1" "4 2"; do
  set -- $run
  s=$1 k=$2 name=ck$1_$2
  ckcfg "$tmp/$name.json" "$k"
  pipe "$s" "$tmp/$name.txt" --deepspeed_config "$tmp/$name.json" --num_steps 4 --partition_method uniform \
      --loss_log_file "$tmp/$name.csv" --save "$tmp/ck_$name" || { cat "$tmp/$name.txt"; fail "$name run"; }
  grep -q "^\[Rank 0\] pipeline stage 0 of $s over the host.*; activation_checkpoint_interval $k: [0-9]* chunk(s) recomputed in backward" \
      "$tmp/$name.txt" || { cat "$tmp/$name.txt"; fail "$name: the stage line"; }
  same_losses "$tmp/single.csv" "$tmp/$name.csv" "pipeline" || { cat "$tmp/$name.txt"; fail "$name: losses"; }
  for f in model.safetensors optimizer.safetensors; do
    cmp "$tmp/ck_single/global_step4/$f" "$tmp/ck_$name/global_step4/$f" || fail "$name: $f differs"
  done
  if [ ! -f "$tmp/p${s}_uniform.txt" ]; then  # the same partition without checkpointing
    pipe "$s" "$tmp/p${s}_uniform.txt" --deepspeed_config "$tmp/a8.json" --num_steps 1 --partition_method uniform \
        || { cat "$tmp/p${s}_uniform.txt"; fail "$s stages without checkpointing"; }
  fi
  with=$(held "$tmp/$name.txt") without=$(held "$tmp/p${s}_uniform.txt")
  [ -n "$with" ] && [ -n "$without" ] && [ "$with" -lt "$without" ] \
      || { cat "$tmp/$name.txt"; fail "$name: activations held $with bytes, without checkpointing $without"; }
  echo "ok: $s stages, activation_checkpoint_interval $k = the single process (losses, checkpoint bytes); stage 0 holds $with activation bytes against $without"
done
ckcfg "$tmp/ckg.json" 1
pipe 2 "$tmp/ckg.txt" "${gpt2[@]}" --deepspeed_config "$tmp/ckg.json" --num_steps 4 --partition_method uniform \
    --loss_log_file "$tmp/ckg.csv" --save "$tmp/ck_ckg" || { cat "$tmp/ckg.txt"; fail "GPT-2 with checkpointing"; }
same_losses "$tmp/g2.csv" "$tmp/ckg.csv" "pipeline" || fail "GPT-2 with checkpointing: losses"
for f in model.safetensors optimizer.safetensors; do
  cmp "$tmp/ck_g2/global_step4/$f" "$tmp/ck_ckg/global_step4/$f" || fail "GPT-2 with checkpointing: $f differs"
done
echo "ok: GPT-2 on 2 stages, activation_checkpoint_interval 1 = without (losses, checkpoint bytes)"
# The degree and the partition from the config's pipeline section (no --pipeline_parallel_size).
ckcfg "$tmp/ckds.json" 2 4 uniform
"$bin" launch --backend host --num_procs 4 --master_port $port -- "$bin" train "${size[@]}" --num_steps 4 \
    --deepspeed_config "$tmp/ckds.json" --loss_log_file "$tmp/ckds.csv" >"$tmp/ckds.txt" 2>&1 \
    || { cat "$tmp/ckds.txt"; fail "the config's pipeline section"; }
port=$(free_port)
grep -q "^\[Rank 0\] pipeline: 4 stages, partition_method uniform:" "$tmp/ckds.txt" || { cat "$tmp/ckds.txt"; fail "pipeline.stages"; }
same_losses "$tmp/single.csv" "$tmp/ckds.csv" "pipeline" || fail "the config's pipeline section: losses"
echo "ok: pipeline.stages 4, pipeline.partition uniform and activation_checkpoint_interval 2 from the config"

refused() {  # refused 'message' PROCS train-args...
  local want=$1 n=$2; shift 2
  if "$bin" launch --backend host --num_procs "$n" --master_port $port -- "$bin" train "${size[@]}" --num_steps 1 "$@" \
      >"$tmp/err.txt" 2>&1; then cat "$tmp/err.txt"; fail "accepted: $*"; fi
  port=$(free_port)
  grep -qF -- "$want" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "message for $* lacks: $want"; }
}
refused "train: --pipeline_parallel_size 3 does not divide the world size 4" 4 --deepspeed_config "$tmp/a8.json" \
    --pipeline_parallel_size 3
refused "pipeline: 7 stages for a model of 6 layers" 7 --deepspeed_config "$tmp/a8.json" --pipeline_parallel_size 7
refused "pipeline: partition_method type:OutputHead matches 1 layer(s) for 2 stages" 2 --deepspeed_config \
    "$tmp/a8.json" --pipeline_parallel_size 2 --partition_method type:OutputHead
refused "--partition_method: expected parameters, uniform or type:REGEX" 2 --deepspeed_config "$tmp/a8.json" \
    --pipeline_parallel_size 2 --partition_method balanced
refused "zero_optimization.stage 2 with --pipeline_parallel_size 2: expected stage 0 or 1" 2 --deepspeed_config \
    "$tmp/z2.json" --pipeline_parallel_size 2
if "$bin" train --deepspeed_config "$tmp/a8.json" --device cuda --pipeline_parallel_size 2 >"$tmp/err.txt" 2>&1; then
  fail "a GPU pipeline in one process was accepted"; fi
grep -qF "train: --pipeline_parallel_size 2 with --device cuda: one stage per GPU rank (activations sent over \
NCCL); expected a launch of at least 2 ranks" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "the GPU message"; }
ckcfg "$tmp/ckbad.json" -1
if "$bin" train "${size[@]}" --deepspeed_config "$tmp/ckbad.json" --num_steps 1 >"$tmp/err.txt" 2>&1; then
  fail "a negative activation_checkpoint_interval was accepted"; fi
grep -qF "pipeline.activation_checkpoint_interval" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "the interval's message"; }
ckcfg "$tmp/ck2.json" 2
if "$bin" train --deepspeed_config "$tmp/ck2.json" --device cuda >"$tmp/err.txt" 2>&1; then
  fail "a GPU interval of 2 was accepted"; fi
grep -qF "gives pipeline.activation_checkpoint_interval 2: the GPU engine checkpoints every block" "$tmp/err.txt" \
    || { cat "$tmp/err.txt"; fail "the GPU interval's message"; }
if "$bin" train "${size[@]}" --deepspeed_config "$tmp/a8.json" --pipeline_stages_in_process 2 >"$tmp/err.txt" 2>&1; then
  fail "virtual stages on the CPU backend were accepted"; fi
grep -qF "train: --pipeline_stages_in_process 2: virtual stages run on --device cuda" "$tmp/err.txt" \
    || { cat "$tmp/err.txt"; fail "the virtual stages' CPU message"; }
echo "ok: bad pipeline input refused"
