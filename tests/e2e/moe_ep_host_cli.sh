#!/usr/bin/env bash
# End to end, MoE expert parallelism on the CPU backend: `cutrain launch --backend host --num_procs
# W -- cutrain train --device cpu --num_experts ... --moe_expert_parallel_size EP` (each MoE block's
# experts split over EP ranks, the tokens exchanged by all-to-all, the expert gradients reduced over
# the W/EP ranks holding them) against the single process with the same global batch
# (train_batch_size W, micro batch 1: the single process accumulates W micro-batches, each rank runs
# one; random data is dealt by rank). Cases: worlds 2, 4 and 8 at ep 2 and 4, top-1 and top-2,
# PR-MoE's residual pyramid, no token dropping, GPT-2's blocks, the Jitter gate noise with activation
# checkpointing (the recompute exchanges again), ZeRO stages 0, 1 and 2. Checked: the
# losses (fp32, within 1e-6 relative), the saved checkpoint (the gathered experts under the single
# process's names: tests/e2e/compare_checkpoints.py), a resume of the single process's checkpoint and
# of an ep-2 checkpoint at ep 4 that continue the single process's losses, and the bad input named
# before any step.
#   moe_ep_host_cli.sh CUTRAIN_BINARY cpu|cuda   (the cuda variant exits 77: the host backend is CPU only)
source "$(dirname "$0")/e2e_lib.sh"
[ "$device" = cuda ] && { echo "the host communicator serves the CPU backend: skipped on cuda"; exit 77; }
clear_launch_env
size=(--device cpu --hidden_dim 32 --num_heads 2 --num_layers 2 --vocab_size 64 --seq_length 8 --batch_size 1
      --log_interval 1 --learning_rate 1e-2 --seed 7)


# run_ep NAME STAGE WORLD EP MOE-FLAGS...: the single process and W ranks at ep_size EP, same flags.
run_ep() {
  local name=$1 stage=$2 w=$3 ep=$4; shift 4
  set -- "$@" --moe_min_capacity 1
  zero_world_config "$stage" "$w"
  "$bin" train --deepspeed_config "$tmp/s${stage}_w$w.json" "${size[@]}" "$@" --num_steps 4 \
      --loss_log_file "$tmp/single_$name.csv" --save "$tmp/ck_single_$name" >"$tmp/single_$name.txt" 2>&1 \
      || { cat "$tmp/single_$name.txt"; fail "$name: single process"; }
  grep -q "accumulation $w)" "$tmp/single_$name.txt" || { cat "$tmp/single_$name.txt"; fail "$name: single accumulation"; }
  "$bin" launch --backend host --num_procs "$w" --master_port "$(free_port)" -- "$bin" train \
      --deepspeed_config "$tmp/s${stage}_w$w.json" "${size[@]}" "$@" --moe_expert_parallel_size "$ep" --num_steps 4 \
      --loss_log_file "$tmp/ep_$name.csv" --save "$tmp/ck_ep_$name" >"$tmp/ep_$name.txt" 2>&1 \
      || { cat "$tmp/ep_$name.txt"; fail "$name: $w ranks at ep_size $ep"; }
  for r in $(seq 0 $((w - 1))); do
    grep -q "^\[Rank $r\] expert parallel: ep_size $ep, member $((r % ep)) of expert-parallel group .*ZeRO stage $stage over $w ranks" \
        "$tmp/ep_$name.txt" || { cat "$tmp/ep_$name.txt"; fail "$name: rank $r's expert-parallel line"; }
  done
  grep -q "data and expert parallel over the host communicator" "$tmp/ep_$name.txt" || fail "$name: start line"
  same_losses "$tmp/single_$name.csv" "$tmp/ep_$name.csv" "$name (world $w, ep $ep)" || { cat "$tmp/ep_$name.txt"; fail "$name: losses"; }
  python3 tests/e2e/compare_checkpoints.py "$tmp/ck_single_$name/global_step4" "$tmp/ck_ep_$name/global_step4" \
      --lr 1e-2 --steps 4 || fail "$name: checkpoint"
  echo "ok: $name: $w ranks at ep_size $ep (ZeRO stage $stage) = the single process (losses, checkpoint)"
}

run_ep w2_ep2_top1 1 2 2 --num_experts 4 --expert_interval 1
run_ep w2_ep2_top2_s0 0 2 2 --num_experts 4 --expert_interval 1 --top_k 2
run_ep w4_ep2_prmoe 2 4 2 --num_experts 2,4 --expert_interval 1 --mlp_type residual
run_ep w4_ep4_top2 1 4 4 --num_experts 4 --expert_interval 1 --top_k 2
run_ep w4_ep2_nodrop 1 4 2 --num_experts 4 --expert_interval 2 --top_k 2 --disable_moe_token_dropping
run_ep w4_ep2_gpt2 2 4 2 --model gpt2 --num_experts 4 --expert_interval 1 --top_k 2
run_ep w8_ep4_top1 2 8 4 --num_experts 4 --expert_interval 1
run_ep w4_ep2_jitter 1 4 2 --num_experts 4 --expert_interval 1 --moe_noisy_gate_policy Jitter --activation_checkpointing

# Resume at another ep_size: the single process's step-4 checkpoint and the ep-2 one (both hold every
# expert whole) on 4 ranks at ep_size 4 continue as the single process does; only
# --moe_expert_parallel_size is given, the MoE blocks come from the checkpoint.
name=w4_ep2_nodrop
"$bin" train --deepspeed_config "$tmp/s1_w4.json" "${size[@]}" --num_steps 2 --resume "$tmp/ck_single_$name" \
    --loss_log_file "$tmp/single_resumed.csv" >"$tmp/single_resumed.txt" 2>&1 \
    || { cat "$tmp/single_resumed.txt"; fail "single resume"; }
for from in single ep; do
  "$bin" launch --backend host --num_procs 4 --master_port "$(free_port)" -- "$bin" train \
      --deepspeed_config "$tmp/s1_w4.json" "${size[@]}" --num_steps 2 --resume "$tmp/ck_${from}_$name" \
      --moe_expert_parallel_size 4 --loss_log_file "$tmp/ep_resumed_$from.csv" >"$tmp/ep_resumed_$from.txt" 2>&1 \
      || { cat "$tmp/ep_resumed_$from.txt"; fail "ep-4 resume of the $from checkpoint"; }
  grep -q "MoE blocks 1: 4 experts, top-2, .*no token dropping.*ep_size 4" "$tmp/ep_resumed_$from.txt" \
      || { cat "$tmp/ep_resumed_$from.txt"; fail "the resume did not take the checkpoint's MoE blocks"; }
  same_losses "$tmp/single_resumed.csv" "$tmp/ep_resumed_$from.csv" "ep-4 resume of the $from checkpoint" \
      || fail "resumed losses ($from)"
  grep -q "^4," "$tmp/ep_resumed_$from.csv" || fail "the resumed run starts at step 4"
done
echo "ok: the single-process and ep-2 checkpoints resumed at ep_size 4"

# Bad input, named before any step.
expect_error() {  # expect_error TEXT WORLD ARGS...
  local want=$1 w=$2; shift 2
  zero_world_config 1 "$w"
  if [ "$w" = 1 ]; then
    "$bin" train --deepspeed_config "$tmp/s1_w1.json" "${size[@]}" --num_steps 1 "$@" >"$tmp/e.txt" 2>&1 && fail "accepted: $*"
  else
    "$bin" launch --backend host --num_procs "$w" --master_port "$(free_port)" -- "$bin" train \
        --deepspeed_config "$tmp/s1_w$w.json" "${size[@]}" --num_steps 1 "$@" >"$tmp/e.txt" 2>&1 && fail "accepted: $*"
  fi
  grep -qF -- "$want" "$tmp/e.txt" || { cat "$tmp/e.txt"; fail "error lacks '$want'"; }
  grep -q "Step 0" "$tmp/e.txt" && fail "a step ran before the error: $*"
  true
}
expect_error "--moe_expert_parallel_size 4 does not divide the data-parallel world size 2" 2 --num_experts 4 --moe_expert_parallel_size 4
expect_error "--moe_expert_parallel_size 2 does not divide the data-parallel world size 1" 1 --num_experts 4 --moe_expert_parallel_size 2
expect_error "--moe_expert_parallel_size 4 does not divide --num_experts 2" 4 --num_experts 2,4 --expert_interval 1 --moe_expert_parallel_size 4
# --device cuda (the model flags without --device cpu): one process refused before any device work
# (its world of 1; the GPU path itself is tests/e2e/moe_ep_cuda_cli.sh's).
if "$bin" train --deepspeed_config "$tmp/s1_w1.json" "${size[@]:2}" --device cuda --num_steps 1 --num_experts 4 \
    --moe_expert_parallel_size 2 >"$tmp/e.txt" 2>&1; then fail "ep_size 2 on cuda accepted"; fi
grep -qF -- "--moe_expert_parallel_size 2 does not divide the data-parallel world size 1" \
    "$tmp/e.txt" || { cat "$tmp/e.txt"; fail "ep_size 2 on cuda: message"; }
expect_error "tensor parallelism of MoE blocks is not built" 2 --num_experts 4 --moe_expert_parallel_size 2 --tensor_parallel_size 2
expect_error "--moe_expert_parallel_size configure MoE blocks: expected --num_experts too" 2 --moe_expert_parallel_size 2
zero_world_config 3 2
if "$bin" launch --backend host --num_procs 2 --master_port "$(free_port)" -- "$bin" train --deepspeed_config "$tmp/s3_w2.json" \
    "${size[@]}" --num_steps 1 --num_experts 4 --moe_expert_parallel_size 2 >"$tmp/e.txt" 2>&1; then fail "stage 3 with ep accepted"; fi
grep -qF "zero_optimization.stage 3 with --moe_expert_parallel_size 2: expert parallelism partitions the expert and non-expert parameters with ZeRO stages 0-2" \
    "$tmp/e.txt" || { cat "$tmp/e.txt"; fail "stage 3 with ep: message"; }
grep -q "Step 0" "$tmp/e.txt" && fail "a step ran before the stage-3 error"
echo "ok: bad expert-parallel input named before any step"
