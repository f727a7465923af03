#!/usr/bin/env bash
# End to end, `cutrain plan` (parallel/planner.h): the table of zero0..zero3, pp and tp for a small
# model on 4 GPUs from the roofline (the source and the link's default said), from a timing report
# given with --kernel_timings (a report of another model refused by its FLOPs), a pipeline's
# partition and bubble line and Megatron's per-block volume, and the bad input, each error naming
# its flag: degrees that do not divide the GPUs, the layers or the heads, an unknown layout, zero
# bandwidth, no --num_gpus. The cuda variant also plans from a profiled run on the GPU (the
# "measured" source and the memory check of that run).
#   plan_cli.sh CUTRAIN_BINARY cpu|cuda
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu
base=(--deepspeed_config configs/bf16_full.json --num_layers 4 --vocab_size 1000 --batch_size 2 --seq_length 64)
model=("${base[@]}" --hidden_dim 256 --num_heads 4)

if [ "$device" = cuda ]; then
  "$bin" plan "${model[@]}" --num_gpus 2 >"$tmp/gpu.txt" 2>&1 || { cat "$tmp/gpu.txt"; fail "plan on the GPU"; }
  grep -q "kernel timings: measured on this GPU" "$tmp/gpu.txt" || { cat "$tmp/gpu.txt"; fail "measured source"; }
  grep -q "memory check of the profiled run (1 GPU, 4 layers): predicted" "$tmp/gpu.txt" || fail "memory check line"
  grep -q "^| zero3 " "$tmp/gpu.txt" || fail "zero3 row"
  echo "plan_cli (cuda): OK"
  exit 0
fi

# The roofline on 4 GPUs: every layout's row, the source and the link's default.
"$bin" plan "${model[@]}" --num_gpus 4 --roofline >"$tmp/roof.txt" 2>&1 || { cat "$tmp/roof.txt"; fail "roofline plan"; }
cat "$tmp/roof.txt"
grep -q "kernel timings: roofline of" "$tmp/roof.txt" || fail "roofline source line"
grep -q "link 450 GB/s per direction, 10 us per ring step (the default: NVLink 4" "$tmp/roof.txt" || fail "link default"
grep -q "^| bf16_full                   |           8 |.*|  <- configs/bf16_full.json" "$tmp/roof.txt" \
    || fail "the state table's row of the config's layout"
grep -q "^| baseline                    |          16 |" "$tmp/roof.txt" || fail "the state table's baseline row"
grep -q "^| zero0      | 4 x 1 x 1 " "$tmp/roof.txt" || fail "zero0 row"
grep -q "^| zero3      | 4 x 1 x 1 " "$tmp/roof.txt" || fail "zero3 row"
grep -q "^| pp4        | 1 x 4 x 1 " "$tmp/roof.txt" || fail "pp4 row"
# Degrees of 2 on 4 GPUs: the rest data parallel.
"$bin" plan "${model[@]}" --num_gpus 4 --roofline --tensor_parallel_size 2 --pipeline_parallel_size 2 >"$tmp/mix.txt" 2>&1 \
    || { cat "$tmp/mix.txt"; fail "pp2 / tp2 plan"; }
grep -q "^| pp2 x dp2  | 2 x 2 x 1 " "$tmp/mix.txt" || { cat "$tmp/mix.txt"; fail "pp2 x dp2 row"; }
grep -q "^| tp2 x dp2  | 2 x 1 x 2 " "$tmp/mix.txt" || fail "tp2 x dp2 row"
grep -q "pp2 x dp2: pipeline: 2 stages, partition_method parameters: stage 0 = layers 0-" "$tmp/mix.txt" || fail "partition line"
grep -q "predicted bubble fraction 0.500" "$tmp/mix.txt" || fail "bubble of 2 stages over 1 micro-batch"
grep -q "tp2 x dp2: Megatron partition .* per block and micro-batch 4 all-reduces of 0.06 MiB" "$tmp/mix.txt" \
    || fail "Megatron volume line"
grep -q "warning: pp2 x dp2 with gradient_accumulation_steps 1" "$tmp/mix.txt" || fail "no-accumulation warning"
# A timing report of this model (cutrain train --timing_report's JSON: regions with calls and
# total_ms; the model FLOPs of the timed run), 2 steps of 1 micro-batch.
report() {  # report OUT HIDDEN
  python3 - "$1" "$2" <<'PY'
import json, sys
h, L, V, S, B, steps = int(sys.argv[2]), 4, 1000, 64, 2, 2
N = L * (12 * h * h + 13 * h) + V * h + V          # the params without the embedding tables
flops = (6 * N + 12 * L * S * h) * B * S
regions = [{"name": "step/fwd/embedding", "calls": steps, "total_ms": 0.02},
           {"name": "step/bwd/embedding", "calls": steps, "total_ms": 0.04},
           {"name": "step/fwd/head", "calls": steps, "total_ms": 0.2},
           {"name": "step/bwd/head", "calls": steps, "total_ms": 0.4},
           {"name": "step/optimizer", "calls": steps, "total_ms": 0.1, "gbps": 1500.0},
           {"name": "step/grad_norm", "calls": steps, "total_ms": 0.02, "gbps": 2500.0}]
for l in range(L):
    regions += [{"name": f"step/fwd/layer{l:02d}", "calls": steps, "total_ms": 0.6},
                {"name": f"step/fwd/layer{l:02d}/attn/ln1", "calls": steps, "total_ms": 0.02},
                {"name": f"step/bwd/layer{l:02d}", "calls": steps, "total_ms": 1.2}]
json.dump({"device": "NVIDIA H200", "steps": steps, "model_flops_per_step": flops, "regions": regions},
          open(sys.argv[1], "w"))
PY
}
report "$tmp/t256.json" 256
"$bin" plan "${model[@]}" --num_gpus 2 --kernel_timings "$tmp/t256.json" >"$tmp/rep.txt" 2>&1 \
    || { cat "$tmp/rep.txt"; fail "plan from a timing report"; }
grep -q "kernel timings: timing report $tmp/t256.json (NVIDIA H200, 2 steps of 4 layers)" "$tmp/rep.txt" \
    || { cat "$tmp/rep.txt"; fail "report source line"; }
grep -q "block fwd 0.300 ms + bwd 0.600 ms" "$tmp/rep.txt" || { cat "$tmp/rep.txt"; fail "per-block times of the report"; }
report "$tmp/t512.json" 512
"$bin" plan "${model[@]}" --num_gpus 2 --kernel_timings "$tmp/t512.json" >"$tmp/other.txt" 2>&1 \
    && fail "a report of another model accepted"
grep -q "error: plan: --kernel_timings $tmp/t512.json: the timed run's model FLOPs per step" "$tmp/other.txt" \
    || { cat "$tmp/other.txt"; fail "another model's report: message"; }
echo '{"steps": 1}' >"$tmp/bad.json"
"$bin" plan "${model[@]}" --num_gpus 2 --kernel_timings "$tmp/bad.json" >"$tmp/bad.txt" 2>&1 && fail "a report without regions"
grep -q "$tmp/bad.json: expected a timing report" "$tmp/bad.txt" || { cat "$tmp/bad.txt"; fail "no regions: message"; }

# Bad input, each naming its flag.
bad() {  # bad EXPECTED-MESSAGE plan-args...
  local want=$1; shift
  if "$bin" plan "${base[@]}" --roofline "$@" >"$tmp/err.txt" 2>&1; then fail "accepted: $*"; fi
  grep -qF -- "$want" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "message for $*: expected '$want'"; }
}
bad "--pipeline_parallel_size 3 does not divide --num_gpus 4" --hidden_dim 256 --num_heads 4 --num_gpus 4 --pipeline_parallel_size 3 --tensor_parallel_size 2
bad "--pipeline_parallel_size 3 does not divide --num_layers 4" --hidden_dim 256 --num_heads 4 --num_gpus 3 --layouts pp
bad "--tensor_parallel_size 4 does not divide --num_heads 2" --hidden_dim 128 --num_heads 2 --num_gpus 4 --layouts tp
bad "--tensor_parallel_size 3 does not divide --num_gpus 4" --hidden_dim 256 --num_heads 4 --num_gpus 4 --layouts tp --tensor_parallel_size 3
bad "--layouts: unknown layout 'zero5'" --hidden_dim 256 --num_heads 4 --num_gpus 4 --layouts zero1,zero5
bad "--link_gbps must be > 0 (GB/s per direction), got 0" --hidden_dim 256 --num_heads 4 --num_gpus 4 --link_gbps 0
bad "--num_gpus must be >= 1, got 0" --num_gpus 0
bad "--num_gpus is required" --layouts zero0
bad "--hidden_dim 256 / --num_heads 8 = head_dim 32; the GPU model's attention takes 64 or 128" --hidden_dim 256 --num_heads 8 --num_gpus 2
bad "num_heads must divide hidden_dim (hidden_dim 256 / num_heads 3" --hidden_dim 256 --num_heads 3 --num_gpus 2
echo "plan_cli: OK"
