#!/usr/bin/env bash
# ncu (full set, one launch each) of the sm90 attention forward and of cuDNN's SDPA forward
# (PyTorch, SDPBackend.CUDNN_ATTENTION) at the same shape and inputs' layout, for a side-by-side
# reading of where the two kernels' time goes (issue #24: the forward's per-tile efficiency).
# Ours runs under bench_attention_hopper (its row for TILE, or the production row), skipping its
# first launches (the correctness call and warm-up).
#   scripts/ncu-attention-fwd.sh [--bench BIN] [--out DIR] [--shape B4H16S2048D64] [--causal]
#                                [--tile rows128|rows192|production]
# Writes DIR/ncu_fwd_ours.txt and DIR/ncu_fwd_cudnn.txt (ncu --page details, with the warp stall
# breakdown) and prints the headline metrics and stall reasons of both.
set -euo pipefail
bench=build/gpu/bench/bench_attention_hopper
out=.
shape=B4H16S2048D64
causal=0
tile=rows192
while (($#)); do
  case "$1" in
    --bench) bench=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    --causal) causal=1; shift ;;
    --tile) tile=$2; shift 2 ;;
    *) echo "ncu-attention-fwd: unknown option $1 (expected --bench, --out, --shape, --causal, --tile)" >&2; exit 2 ;;
  esac
done
if [[ ! $shape =~ ^B([0-9]+)H([0-9]+)S([0-9]+)D(64|128)$ ]]; then
  echo "ncu-attention-fwd: --shape must look like B4H16S2048D64 (head dim 64 or 128), got '$shape'" >&2
  exit 2
fi
B=${BASH_REMATCH[1]} H=${BASH_REMATCH[2]} S=${BASH_REMATCH[3]} D=${BASH_REMATCH[4]}
sfx=""
if [ "$causal" = 1 ]; then sfx=_causal; fi  # (a failing $(...) in an assignment would end the script: set -e)
case "$tile" in
  rows128 | rows192) row="fwd${sfx}_$tile/$shape" ;;
  production) row="fwd$sfx/$shape" ;;
  *) echo "ncu-attention-fwd: --tile must be rows128, rows192 or production, got '$tile'" >&2; exit 2 ;;
esac
[ -x "$bench" ] || { echo "ncu-attention-fwd: $bench not built" >&2; exit 2; }
mkdir -p "$out"

# The full set, plus the warp stall breakdown it leaves out (scripts/ncu_summary.py --stalls).
stalls=$(python3 scripts/ncu_summary.py --print-stall-metrics)
ncu --set full --metrics "$stalls" --kernel-name-base demangled -k regex:'sm90.*forward_kernel' --launch-skip 3 -c 1 \
  --page details "$bench" --benchmark_filter="^attention_hopper/$row/" >"$out/ncu_fwd_ours.txt" 2>&1 || true

py=$(mktemp --suffix=.py)
trap 'rm -f "$py"' EXIT
cat >"$py" <<EOF
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
qkv = torch.randn($B, $S, 3, $H, $D, device="cuda", dtype=torch.bfloat16)
q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(8):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=bool($causal))
torch.cuda.synchronize()
EOF
ncu --set full --metrics "$stalls" -k regex:'fprop|sdpa|fmha|flash' --launch-skip 3 -c 1 --page details python3 "$py" \
  >"$out/ncu_fwd_cudnn.txt" 2>&1 || true

# The headline rows of each report, then the stall reasons (warp cycles per issued instruction,
# largest first).
for side in ours cudnn; do
  echo "== $side ($row / cuDNN SDPA at $shape, causal $causal)"
  grep -E "^  [a-zA-Z_].*\(|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Registers Per Thread|Achieved Occupancy|Executed Ipc Active|Issue Slots Busy|No Eligible|Block Limit|Warp Cycles Per Issued|Dynamic Shared Memory Per Block|Threads|Grid Size|One or More Eligible" \
    "$out/ncu_fwd_$side.txt" | head -40 || echo "(no headline metrics: see $out/ncu_fwd_$side.txt)"
  python3 scripts/ncu_summary.py --stalls --top 10 "$out/ncu_fwd_$side.txt" || true
done
