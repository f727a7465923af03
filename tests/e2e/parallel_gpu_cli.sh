#!/usr/bin/env bash
# End to end, the GPU engine's pipeline and tensor-parallel code paths on one GPU: `cutrain train
# --device cuda` with --pipeline_parallel_size 1 (the step through the pipeline's 1F1B program), the
# config's pipeline section (degree and partition from it), --pipeline_stages_in_process 2 and 3
# (virtual stages), --tensor_parallel_size 1 (the blocks' all-reduces over a one-rank NCCL
# communicator) and both together, each against the plain engine's losses over 4 micro-batches per
# step, pipeline.activation_checkpoint_interval 1 against --activation_checkpointing; then the bad input, refused before any work with the flag named: a pipeline degree above 1
# on cuda in one process, with GPT-2 or with ZeRO stage 1 (the multi-GPU pipeline's limits), a tensor-parallel degree above 1 on cuda, virtual stages with --pipeline_parallel_size
# above 1 or on the CPU backend, a partial stage of GPT-2, pipeline.activation_checkpoint_interval 2
# on cuda. The cpu variant runs the refusals that need no GPU.
#   parallel_gpu_cli.sh CUTRAIN_BINARY cpu|cuda
source "$(dirname "$0")/e2e_lib.sh"
clear_launch_env
python3 - "$tmp/a4.json" <<'PY'
import json, sys
c = json.load(open("configs/bf16_full.json"))
c["zero_optimization"]["stage"] = 0
c["train_micro_batch_size_per_gpu"] = 2
c["gradient_accumulation_steps"] = 4
json.dump(c, open(sys.argv[1], "w"))
PY
python3 - "$tmp/a4.json" "$tmp/ds.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["pipeline"] = {"stages": 1, "partition": "uniform", "activation_checkpoint_interval": 0}
json.dump(c, open(sys.argv[2], "w"))
PY
python3 - "$tmp/a4.json" "$tmp/z1.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"]["stage"] = 1
json.dump(c, open(sys.argv[2], "w"))
PY
refused() {  # refused 'message' train-args...
  local want=$1; shift
  if "$bin" train --num_steps 1 "$@" >"$tmp/err.txt" 2>&1; then cat "$tmp/err.txt"; fail "accepted: $*"; fi
  grep -qF -- "$want" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "message for $* lacks: $want"; }
}
refused "train: --pipeline_parallel_size 2 with --device cuda: one stage per GPU rank (activations sent over NCCL); \
expected a launch of at least 2 ranks (cutrain launch --num_gpus 2), found one process" --device cuda \
    --deepspeed_config "$tmp/a4.json" --pipeline_parallel_size 2
refused "train: --pipeline_parallel_size 2 with --device cuda and --model gpt2: the GPU model's stages of part of a \
tied-head model" --device cuda --model gpt2 --deepspeed_config "$tmp/a4.json" --pipeline_parallel_size 2
refused "train: --pipeline_parallel_size 2 with --device cuda and zero_optimization.stage 1: each GPU stage averages \
its gradients over its data-parallel group (stage 0); ZeRO stages 1-3 inside a GPU pipeline are not built" \
    --device cuda --deepspeed_config "$tmp/z1.json" --pipeline_parallel_size 2
refused "train: --tensor_parallel_size 2 with --device cuda: each tensor-parallel rank is a process on its own GPU" --device cuda \
    --deepspeed_config "$tmp/a4.json" --tensor_parallel_size 2
refused "train: --pipeline_stages_in_process 2 with --pipeline_parallel_size 2: the stages of this process are the \
whole pipeline" --device cuda --deepspeed_config "$tmp/a4.json" --pipeline_stages_in_process 2 --pipeline_parallel_size 2
refused "train: --pipeline_stages_in_process 2: virtual stages run on --device cuda" --device cpu \
    --deepspeed_config "$tmp/a4.json" --pipeline_stages_in_process 2
refused "train: --pipeline_stages_in_process: expected a number of stages >= 1, found 0" --device cuda \
    --deepspeed_config "$tmp/a4.json" --pipeline_stages_in_process 0
echo "ok: bad input refused before any work"
[ "$device" = cuda ] || { echo "the GPU runs: skipped on cpu"; exit 0; }
skip_without_gpu
small_size 4
run() {  # run NAME train-args...
  local name=$1; shift
  "$bin" train --device cuda "${size[@]}" --num_steps 6 --log_interval 1 --loss_log_file "$tmp/$name.csv" "$@" \
      >"$tmp/$name.txt" 2>&1 || { cat "$tmp/$name.txt"; fail "$name run"; }
}
run plain --deepspeed_config "$tmp/a4.json"
run pp1 --deepspeed_config "$tmp/a4.json" --pipeline_parallel_size 1
grep -q "pipeline: 1 stages, partition_method parameters:.*the GPU engine's step through the 1F1B program of the one stage" \
    "$tmp/pp1.txt" || { cat "$tmp/pp1.txt"; fail "pp1: the pipeline line"; }
run ds --deepspeed_config "$tmp/ds.json"
grep -q "pipeline: 1 stages, partition_method uniform" "$tmp/ds.txt" || { cat "$tmp/ds.txt"; fail "the config's pipeline section"; }
run v2 --deepspeed_config "$tmp/a4.json" --pipeline_stages_in_process 2 --partition_method uniform
grep -q "all 2 stages in this process (virtual stages: 3 models" "$tmp/v2.txt" || { cat "$tmp/v2.txt"; fail "v2: the line"; }
run v3 --deepspeed_config "$tmp/a4.json" --pipeline_stages_in_process 3 --activation_checkpointing
run plain_ckpt --deepspeed_config "$tmp/a4.json" --activation_checkpointing
python3 - "$tmp/a4.json" "$tmp/ck1.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["pipeline"] = {"activation_checkpoint_interval": 1}
json.dump(c, open(sys.argv[2], "w"))
PY
run ck1 --deepspeed_config "$tmp/ck1.json"
grep -q "pipeline.activation_checkpoint_interval 1: every block recomputed in backward" "$tmp/ck1.txt" \
    || { cat "$tmp/ck1.txt"; fail "ck1: the interval's line"; }
run tp1 --deepspeed_config "$tmp/a4.json" --tensor_parallel_size 1
grep -q "tensor parallel: rank 0 of 1: .* over the nccl communicator (world 1): per micro-batch 8 forward and 8 backward" \
    "$tmp/tp1.txt" || { cat "$tmp/tp1.txt"; fail "tp1: the slice line"; }
run pp1tp1 --deepspeed_config "$tmp/a4.json" --pipeline_parallel_size 1 --tensor_parallel_size 1
for name in pp1 ds v2 tp1 pp1tp1; do
  same_losses "$tmp/plain.csv" "$tmp/$name.csv" "$name" || { cat "$tmp/$name.txt"; fail "$name: losses"; }
done
same_losses "$tmp/plain_ckpt.csv" "$tmp/v3.csv" "v3" || fail "3 virtual stages with checkpointing: losses"
same_losses "$tmp/plain_ckpt.csv" "$tmp/ck1.csv" "ck1" || fail "pipeline.activation_checkpoint_interval 1: losses"
echo "ok: pipeline degree 1, the config's pipeline section, 2 and 3 virtual stages, tensor parallel degree 1 = the plain engine"
refused "gpu model: a pipeline stage of part of the model (layers [0, " --device cuda "${size[@]}" --model gpt2 \
    --deepspeed_config "$tmp/a4.json" --pipeline_stages_in_process 2
echo "ok: a partial stage of GPT-2 refused"
