#!/usr/bin/env bash
# End to end, MoE expert parallelism on the GPU engine (`--device cuda --moe_expert_parallel_size`):
# on one GPU, ep_size 1 takes the expert-parallel path (the token all-to-all over a world-1 NCCL
# communicator, every row sent to the rank itself) and must give the plain MoE run's losses (1e-6
# relative, both without token dropping, so both on the packed rows; top-2 on the BF16 example's
# blocks at ZeRO 0, GPT-2's blocks with PR-MoE's residual MLP at ZeRO 1); the bad input is named before any step (ep_size not dividing the experts or the
# world, ZeRO stage 3). With 2 GPUs and NCCL: `cutrain launch --num_gpus 2` at ep_size 2 (each
# rank holding half the experts, the tokens exchanged between the GPUs) against the single process
# on the same fixed batch (every rank sees it: the expert gradient over both ranks' identical
# tokens divided by the world is the single process's; 1e-3 relative, the expert GEMMs summing
# twice the rows); skipped with fewer GPUs.
#   moe_ep_cuda_cli.sh CUTRAIN_BINARY cpu|cuda   (the cpu variant exits 77: the CPU backend's
#   expert parallelism is tests/e2e/moe_ep_host_cli.sh's)
source "$(dirname "$0")/e2e_lib.sh"
[ "$device" = cuda ] || { echo "the GPU engine's expert parallelism: skipped on cpu"; exit 77; }
skip_without_gpu
clear_launch_env
small_size
common=(--device cuda "${size[@]}" --num_steps 4 --log_interval 1 --fixed_batch --learning_rate 1e-2 --seed 7)

stage_config() {  # stage_config STAGE -> $tmp/stageSTAGE.json
  python3 - "$1" "$tmp/stage$1.json" <<'PY'
import json, sys
c = json.load(open("configs/baseline.json"))
c["zero_optimization"]["stage"] = int(sys.argv[1])
json.dump(c, open(sys.argv[2], "w"))
PY
}
for s in 0 1 3; do stage_config $s; done

# ep1 NAME STAGE MOE-FLAGS...: the plain MoE run and the same at --moe_expert_parallel_size 1.
ep1() {
  local name=$1 stage=$2; shift 2
  "$bin" train --deepspeed_config "$tmp/stage$stage.json" "${common[@]}" "$@" --loss_log_file "$tmp/plain_$name.csv" \
      >"$tmp/plain_$name.txt" 2>&1 || { cat "$tmp/plain_$name.txt"; fail "$name: plain MoE run"; }
  "$bin" train --deepspeed_config "$tmp/stage$stage.json" "${common[@]}" "$@" --moe_expert_parallel_size 1 \
      --loss_log_file "$tmp/ep1_$name.csv" >"$tmp/ep1_$name.txt" 2>&1 || { cat "$tmp/ep1_$name.txt"; fail "$name: ep_size 1"; }
  grep -q "expert parallel: ep_size 1 of world 1 (token all-to-all over nccl)" "$tmp/ep1_$name.txt" \
      || { cat "$tmp/ep1_$name.txt"; fail "$name: the expert-parallel path's start line"; }
  if grep -q "expert parallel" "$tmp/plain_$name.txt"; then fail "$name: the plain run took the expert-parallel path"; fi
  same_losses "$tmp/plain_$name.csv" "$tmp/ep1_$name.csv" "$name at ep_size 1" || fail "$name: losses"
  echo "ok: $name: ep_size 1 through the NCCL all-to-all = the plain MoE run"
}
# Without token dropping both runs take the packed rows' grouped GEMMs (with dropping the plain run
# takes the [experts, capacity] slots' batched GEMMs: other kernels, other roundings).
ep1 top2_s0 0 --num_experts 4 --expert_interval 1 --top_k 2 --disable_moe_token_dropping
ep1 gpt2_residual_s1 1 --model gpt2 --num_experts 2,4 --expert_interval 1 --mlp_type residual --disable_moe_token_dropping

# Bad input: named before any step.
bad() {  # bad EXPECTED-TEXT FLAGS...
  local want=$1; shift
  if "$bin" train "${common[@]}" "$@" >"$tmp/bad.txt" 2>&1; then cat "$tmp/bad.txt"; fail "accepted: $*"; fi
  grep -qF -- "$want" "$tmp/bad.txt" || { cat "$tmp/bad.txt"; fail "expected '$want' for: $*"; }
  if grep -q "Step 1" "$tmp/bad.txt"; then fail "a step ran before the error: $*"; fi
}
bad "--moe_expert_parallel_size 3 does not divide --num_experts 4" --deepspeed_config "$tmp/stage0.json" \
    --num_experts 4 --moe_expert_parallel_size 3
bad "--moe_expert_parallel_size 2 does not divide the data-parallel world size 1" \
    --deepspeed_config "$tmp/stage0.json" --num_experts 4 --moe_expert_parallel_size 2
bad "zero_optimization.stage 3 with --moe_expert_parallel_size 1" --deepspeed_config "$tmp/stage3.json" \
    --num_experts 4 --moe_expert_parallel_size 1
echo "ok: bad input named"

# Two GPUs: ep_size 2 against the single process.
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 2 ]; then echo "ep_size 2 needs 2 GPUs, found ${gpus:-0}: that part skipped"; exit 0; fi
moe=(--num_experts 4 --expert_interval 1 --top_k 2)
"$bin" train --deepspeed_config "$tmp/stage0.json" "${common[@]}" "${moe[@]}" --loss_log_file "$tmp/single.csv" \
    >"$tmp/single.txt" 2>&1 || { cat "$tmp/single.txt"; fail "single-process run"; }
for stage in 0 1; do
  out=$tmp/ep2_s$stage.txt
  # Rank 0 writes the loss file (every rank trains on the same fixed batch).
  "$bin" launch --num_gpus 2 --master_port "$(free_port)" -- "$bin" train --deepspeed_config "$tmp/stage$stage.json" \
      "${common[@]}" "${moe[@]}" --moe_expert_parallel_size 2 --loss_log_file "$tmp/ep2_s$stage.csv" \
      >"$out" 2>&1 || { cat "$out"; fail "ep_size 2 at ZeRO $stage"; }
  grep -q "expert parallel: ep_size 2 of world 2" "$out" || { cat "$out"; fail "ep_size 2: start line"; }
  python3 - "$tmp/single.csv" "$tmp/ep2_s$stage.csv" <<'PY' || { cat "$out"; fail "ep_size 2 at ZeRO $stage: losses"; }
import csv, sys
runs = [[float(r["loss"]) for r in csv.DictReader(open(p))] for p in sys.argv[1:]]
assert len(runs[0]) == 4 and len(runs[1]) == 4, runs
for a, b in zip(runs[0], runs[1]):
    assert abs(a - b) <= 1e-3 * max(1.0, abs(a)), ("ep_size 2 on 2 GPUs != single process", runs[0], runs[1])
PY
  echo "ok: ep_size 2 over 2 GPUs (ZeRO $stage) = the single process"
done
