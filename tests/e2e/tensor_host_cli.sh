#!/usr/bin/env bash
# End to end, tensor parallelism on the CPU backend: `cutrain launch --backend host --num_procs N --
# cutrain train --device cpu --tensor_parallel_size T` against the single process on the same
# global batch: the same losses (within 1e-6 relative) and the same checkpoint.
#   TP 2, 4, 8 (the seed model: checkpoint bytes; GPT-2 with its tied head at TP 2 and 4: within
#   tests/e2e/compare_checkpoints.py's tolerance); Domino's 2 pieces at TP 2 and its summary line;
#   tensor_parallel.autotp_size from the config; DP x TP (2 x 2 at ZeRO 0-3, 2 x 4 GPT-2 ZeRO-1);
#   PP x TP (2 x 2; GPT-2 2 x 4; 2 x 2 with Domino) and DP x PP x TP (2 x 2 x 2); a TP checkpoint
#   resumed by one process; a killed rank named by the survivor; the bad input: a degree that does
#   not divide the world size, the heads or the vocabulary, Domino's pieces that do not divide the
#   micro-batch or come without TP, TP on cuda.
#   tensor_host_cli.sh CUTRAIN_BINARY cpu|cuda   (the cuda variant exits 77: CPU backend only)
source "$(dirname "$0")/e2e_lib.sh"
[ "$device" = cuda ] && { echo "tensor parallelism runs on the CPU backend: skipped on cuda"; exit 77; }
clear_launch_env
port=$(free_port)
size=(--device cpu --hidden_dim 32 --num_heads 8 --num_layers 2 --vocab_size 64 --seq_length 8 --batch_size 2
      --log_interval 1 --learning_rate 1e-2 --seed 7)
config() {  # config OUT STAGE [AUTOTP]: global batch 8 (micro 2), accumulation from the world
  python3 - "$1" "$2" "${3:-0}" <<'PY'
import json, sys
c = json.load(open("configs/baseline.json"))
c["zero_optimization"]["stage"] = int(sys.argv[2])
c["train_micro_batch_size_per_gpu"] = 2
c["train_batch_size"] = 8
c.pop("gradient_accumulation_steps", None)
if int(sys.argv[3]):
    c["tensor_parallel"] = {"autotp_size": int(sys.argv[3])}
json.dump(c, open(sys.argv[1], "w"))
PY
}
for z in 0 1 2 3; do config "$tmp/z$z.json" $z; done
config "$tmp/auto2.json" 0 2
run() {  # run PROCS OUT train-args...
  local n=$1 out=$2; shift 2
  "$bin" launch --backend host --num_procs "$n" --master_port $port -- "$bin" train "${size[@]}" "$@" >"$out" 2>&1
  local rc=$?
  port=$(free_port)
  return $rc
}
single() {  # single NAME train-args...: the one-process reference
  local name=$1; shift
  "$bin" train "${size[@]}" --deepspeed_config "$tmp/z0.json" --num_steps 3 --loss_log_file "$tmp/$name.csv" \
      --save "$tmp/ck_$name" "$@" >"$tmp/$name.txt" 2>&1 || { cat "$tmp/$name.txt"; fail "$name: single process"; }
}
single s1
single g1 --model gpt2

# TP alone: 2, 4 and 8 ranks of the seed model; the checkpoint bytes are the single process's.
for t in 2 4 8; do
  name=tp$t
  run "$t" "$tmp/$name.txt" --deepspeed_config "$tmp/z0.json" --num_steps 3 --tensor_parallel_size "$t" \
      --loss_log_file "$tmp/$name.csv" --save "$tmp/ck_$name" || { cat "$tmp/$name.txt"; fail "$name run"; }
  h=$((8 / t)) v=$((64 / t))
  grep -q "^\[Rank $((t - 1))\] tensor parallel: rank $((t - 1)) of $t: heads \[$((8 - h)), 8), FFN columns \[$((128 - 128 / t)), 128), vocabulary rows \[$((64 - v)), 64)" \
      "$tmp/$name.txt" || { cat "$tmp/$name.txt"; fail "$name: the last rank's slice line"; }
  same_losses "$tmp/s1.csv" "$tmp/$name.csv" "tensor parallel" || { cat "$tmp/$name.txt"; fail "$name: losses"; }
  for f in model.safetensors optimizer.safetensors trainer_state.json; do
    cmp "$tmp/ck_s1/global_step3/$f" "$tmp/ck_$name/global_step3/$f" || fail "$name: $f differs"
  done
  echo "ok: TP $t = the single process (losses, checkpoint bytes)"
done
# GPT-2: the tied embedding / head vocabulary-parallel.
for t in 2 4; do
  name=gtp$t
  run "$t" "$tmp/$name.txt" --model gpt2 --deepspeed_config "$tmp/z0.json" --num_steps 3 --tensor_parallel_size "$t" \
      --loss_log_file "$tmp/$name.csv" --save "$tmp/ck_$name" || { cat "$tmp/$name.txt"; fail "$name run"; }
  same_losses "$tmp/g1.csv" "$tmp/$name.csv" "tensor parallel" || { cat "$tmp/$name.txt"; fail "$name: losses"; }
  python3 tests/e2e/compare_checkpoints.py "$tmp/ck_g1/global_step3" "$tmp/ck_$name/global_step3" \
      || fail "$name: checkpoint"
  echo "ok: GPT-2 (tied head) at TP $t = the single process (losses, checkpoint)"
done

# Domino: 2 pieces per micro-batch; the summary reports the modelled hidden fraction.
run 2 "$tmp/dom.txt" --deepspeed_config "$tmp/z0.json" --num_steps 3 --tensor_parallel_size 2 --domino 2 \
    --loss_log_file "$tmp/dom.csv" --save "$tmp/ck_dom" || { cat "$tmp/dom.txt"; fail "domino run"; }
same_losses "$tmp/s1.csv" "$tmp/dom.csv" "tensor parallel" || { cat "$tmp/dom.txt"; fail "domino: losses"; }
python3 tests/e2e/compare_checkpoints.py "$tmp/ck_s1/global_step3" "$tmp/ck_dom/global_step3" || fail "domino: checkpoint"
grep -q "Domino: 2 pieces per micro-batch" "$tmp/dom.txt" || { cat "$tmp/dom.txt"; fail "domino: the slice line"; }
grep -Eq "^  Rank 0's domino: 2 pieces per micro-batch; tensor-parallel all-reduces [0-9.]+ s beside [0-9.]+ s of compute \(forward and backward\); [0-9.]+% of the communication hidden \(modelled on the host" \
    "$tmp/dom.txt" || { cat "$tmp/dom.txt"; fail "domino: the summary line"; }
grep -q "^  Rank 0's domino: 1 piece per micro-batch; .*; 0.0% of the communication hidden" "$tmp/tp2.txt" \
    || { cat "$tmp/tp2.txt"; fail "one piece: nothing hidden"; }
echo "ok: Domino's 2 pieces = the single process; the hidden fraction reported"

# The degree from the config's tensor_parallel.autotp_size.
run 2 "$tmp/auto.txt" --deepspeed_config "$tmp/auto2.json" --num_steps 3 --loss_log_file "$tmp/auto.csv" \
    || { cat "$tmp/auto.txt"; fail "autotp_size run"; }
grep -q "tensor parallel: rank 1 of 2" "$tmp/auto.txt" || { cat "$tmp/auto.txt"; fail "autotp_size: no TP"; }
same_losses "$tmp/s1.csv" "$tmp/auto.csv" "tensor parallel" || fail "autotp_size: losses"
"$bin" check-config "$tmp/auto2.json" >"$tmp/cc.txt" 2>&1 || { cat "$tmp/cc.txt"; fail "check-config"; }
grep -q "^  tensor     autotp_size 2 " "$tmp/cc.txt" || { cat "$tmp/cc.txt"; fail "check-config: the tensor line"; }
echo "ok: tensor_parallel.autotp_size 2 (train, check-config)"

# DP x TP: ZeRO's reductions over each tensor-parallel index's replicas.
for run_ in "4 2 simple 0" "4 2 simple 1" "4 2 simple 2" "4 2 simple 3" "8 4 gpt2 1"; do
  set -- $run_
  w=$1 t=$2 m=$3 z=$4 name=dp$(($1 / $2))xtp$2_$3_z$4 ref=s1
  [ "$m" = gpt2 ] && ref=g1
  run "$w" "$tmp/$name.txt" --model "$m" --deepspeed_config "$tmp/z$z.json" --num_steps 3 --tensor_parallel_size "$t" \
      --loss_log_file "$tmp/$name.csv" --save "$tmp/ck_$name" || { cat "$tmp/$name.txt"; fail "$name run"; }
  grep -q "data parallel: replica 1 of $((w / t)) (its ZeRO reductions over the $((w / t)) ranks of tensor-parallel index" \
      "$tmp/$name.txt" || { cat "$tmp/$name.txt"; fail "$name: the replica line"; }
  same_losses "$tmp/$ref.csv" "$tmp/$name.csv" "tensor parallel" || { cat "$tmp/$name.txt"; fail "$name: losses"; }
  python3 tests/e2e/compare_checkpoints.py "$tmp/ck_$ref/global_step3" "$tmp/ck_$name/global_step3" \
      || fail "$name: checkpoint"
  echo "ok: $m, DP $((w / t)) x TP $t, ZeRO stage $z = the single process (losses, checkpoint)"
done

# PP x TP and DP x PP x TP.
for run_ in "4 2 2 simple 0" "8 2 4 gpt2 0" "8 2 2 gpt2 1"; do
  set -- $run_
  w=$1 s=$2 t=$3 m=$4 z=$5 dp=$(($1 / ($2 * $3))) name=pp$2xdp$((w / (s * t)))xtp$3_$4 ref=s1
  [ "$m" = gpt2 ] && ref=g1
  run "$w" "$tmp/$name.txt" --model "$m" --deepspeed_config "$tmp/z$z.json" --num_steps 3 --tensor_parallel_size "$t" \
      --pipeline_parallel_size "$s" --partition_method uniform --loss_log_file "$tmp/$name.csv" --save "$tmp/ck_$name" \
      || { cat "$tmp/$name.txt"; fail "$name run"; }
  grep -q "^\[Rank $((w - 1))\] stage $((s - 1)): tensor parallel: rank $((t - 1)) of $t" "$tmp/$name.txt" \
      || { cat "$tmp/$name.txt"; fail "$name: the last rank's stage line"; }
  grep -q "^\[Rank 0\] tensor parallel: world $w = $s stage(s) x $dp replica(s) x $t tensor-parallel ranks" \
      "$tmp/$name.txt" || { cat "$tmp/$name.txt"; fail "$name: the grid line"; }
  same_losses "$tmp/$ref.csv" "$tmp/$name.csv" "tensor parallel" || { cat "$tmp/$name.txt"; fail "$name: losses"; }
  python3 tests/e2e/compare_checkpoints.py "$tmp/ck_$ref/global_step3" "$tmp/ck_$name/global_step3" \
      || fail "$name: checkpoint"
  echo "ok: $m, PP $s x DP $dp x TP $t (ZeRO $z) = the single process (losses, checkpoint)"
done

# pipeline.activation_checkpoint_interval 1 inside PP 2 x TP 2: each stage's layers recomputed one by
# one (their tensor-parallel all-reduces again): the same losses and checkpoint bytes as without.
python3 - "$tmp/z0.json" "$tmp/z0ck.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["pipeline"] = {"activation_checkpoint_interval": 1}
json.dump(c, open(sys.argv[2], "w"))
PY
run 4 "$tmp/ppck.txt" --deepspeed_config "$tmp/z0ck.json" --num_steps 3 --tensor_parallel_size 2 \
    --pipeline_parallel_size 2 --partition_method uniform --loss_log_file "$tmp/ppck.csv" --save "$tmp/ck_ppck" \
    || { cat "$tmp/ppck.txt"; fail "PP x TP with activation_checkpoint_interval 1"; }
same_losses "$tmp/pp2xdp1xtp2_simple.csv" "$tmp/ppck.csv" "checkpointed" || { cat "$tmp/ppck.txt"; fail "PP x TP ckpt: losses"; }
for f in model.safetensors optimizer.safetensors; do
  cmp "$tmp/ck_pp2xdp1xtp2_simple/global_step3/$f" "$tmp/ck_ppck/global_step3/$f" || fail "PP x TP ckpt: $f differs"
done
echo "ok: PP 2 x TP 2 with activation_checkpoint_interval 1 = without (losses, checkpoint bytes)"

# Domino inside a pipeline's stages: PP 2 x TP 2, 2 pieces.
run 4 "$tmp/ppdom.txt" --deepspeed_config "$tmp/z0.json" --num_steps 3 --tensor_parallel_size 2 \
    --pipeline_parallel_size 2 --domino 2 --loss_log_file "$tmp/ppdom.csv" || { cat "$tmp/ppdom.txt"; fail "PP x TP domino"; }
grep -q "^\[Rank 3\] stage 1: tensor parallel: rank 1 of 2: .*; per micro-batch 8 forward and 6 backward all-reduces.*; Domino: 2 pieces" \
    "$tmp/ppdom.txt" || { cat "$tmp/ppdom.txt"; fail "PP x TP domino: the last stage's line"; }
same_losses "$tmp/s1.csv" "$tmp/ppdom.csv" "tensor parallel" || { cat "$tmp/ppdom.txt"; fail "PP x TP domino: losses"; }
echo "ok: PP 2 x TP 2 with Domino's 2 pieces = the single process"

# A TP checkpoint is the whole model: one process resumes it as it resumes its own.
"$bin" train "${size[@]}" --deepspeed_config "$tmp/z0.json" --num_steps 2 --resume "$tmp/ck_s1" \
    --loss_log_file "$tmp/r1.csv" >"$tmp/r1.txt" 2>&1 || { cat "$tmp/r1.txt"; fail "single resume"; }
"$bin" train "${size[@]}" --deepspeed_config "$tmp/z0.json" --num_steps 2 --resume "$tmp/ck_tp4" \
    --loss_log_file "$tmp/r4.csv" >"$tmp/r4.txt" 2>&1 || { cat "$tmp/r4.txt"; fail "TP 4 checkpoint on one process"; }
same_losses "$tmp/r1.csv" "$tmp/r4.csv" "tensor parallel" || fail "resumed losses"
run 2 "$tmp/r2.txt" --deepspeed_config "$tmp/z0.json" --num_steps 2 --resume "$tmp/ck_s1" --tensor_parallel_size 2 \
    --loss_log_file "$tmp/r2.csv" || { cat "$tmp/r2.txt"; fail "single checkpoint at TP 2"; }
same_losses "$tmp/r1.csv" "$tmp/r2.csv" "tensor parallel" || fail "TP 2 resumed losses"
echo "ok: a TP 4 checkpoint resumed by one process, a single-process one at TP 2"

# A tensor-parallel rank killed mid-run (two ranks started by hand, no launcher to stop the other):
# the survivor, waiting in its group's all-reduce, names the dead rank within seconds.
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$bin" train "${size[@]}" --deepspeed_config \
    "$tmp/z0.json" --tensor_parallel_size 2 --num_steps 1000000 >"$tmp/killed.txt" 2>&1 &
victim=$!
(sleep 2; kill -KILL $victim) &
t0=$(date +%s)
if RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$bin" train "${size[@]}" \
    --deepspeed_config "$tmp/z0.json" --tensor_parallel_size 2 --num_steps 1000000 >"$tmp/survivor.txt" 2>&1; then
  fail "rank 0 finished although rank 1 was killed"; fi
wait 2>/dev/null || true
port=$(free_port)
grep -q "host communicator: rank 0: .*rank 1 (pid [0-9]*) exited without closing the communicator" \
    "$tmp/survivor.txt" || { tail -5 "$tmp/survivor.txt"; fail "the survivor does not name the dead rank"; }
(( $(date +%s) - t0 < 30 )) || fail "the dead rank was found only after $(( $(date +%s) - t0 )) s"
echo "ok: a killed tensor-parallel rank is named by the survivor"

refused() {  # refused 'message' PROCS train-args...
  local want=$1 n=$2; shift 2
  if "$bin" launch --backend host --num_procs "$n" --master_port $port -- "$bin" train "${rsize[@]}" --num_steps 1 "$@" \
      >"$tmp/err.txt" 2>&1; then cat "$tmp/err.txt"; fail "accepted: $*"; fi
  port=$(free_port)
  grep -qF -- "$want" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "message for $* lacks: $want"; }
}
rsize=("${size[@]}")
refused "--tensor_parallel_size 3 does not divide the world size 4" 4 --deepspeed_config "$tmp/z0.json" \
    --tensor_parallel_size 3
refused "--tensor_parallel_size 3 does not divide the attention heads (--num_heads 8)" 3 --deepspeed_config \
    "$tmp/z0.json" --tensor_parallel_size 3
rsize=("${size[@]/#64/63}")  # --vocab_size 63
refused "--tensor_parallel_size 2 does not divide the vocabulary (63 rows of the embedding: --vocab_size 63" 2 \
    --deepspeed_config "$tmp/z0.json" --tensor_parallel_size 2
rsize=("${size[@]}")
refused "tensor_parallel.autotp_size ($tmp/auto2.json) 2 does not divide the world size 3" 3 --deepspeed_config \
    "$tmp/auto2.json"
refused "--pipeline_parallel_size 4 with --tensor_parallel_size 2 does not divide the world size 4" 4 \
    --deepspeed_config "$tmp/z0.json" --tensor_parallel_size 2 --pipeline_parallel_size 4
refused "--domino 3 does not divide the micro-batch of 2 sequences" 2 --deepspeed_config "$tmp/z0.json" \
    --tensor_parallel_size 2 --domino 3
refused "--domino 2: Domino splits the tensor-parallel all-reduces; expected --tensor_parallel_size > 1, found 1" 1 \
    --deepspeed_config "$tmp/z0.json" --domino 2
if "$bin" train --deepspeed_config "$tmp/z0.json" --device cuda --tensor_parallel_size 2 >"$tmp/err.txt" 2>&1; then
  fail "a GPU tensor-parallel run was accepted"; fi
grep -qF "train: --tensor_parallel_size 2 with --device cuda: each tensor-parallel rank is a process on its own GPU \
over NCCL; expected a launch of 2 ranks or a multiple (cutrain launch --num_gpus 2), found 1" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "the GPU message"; }
echo "ok: bad tensor-parallel input refused"
