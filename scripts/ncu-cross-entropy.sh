#!/usr/bin/env bash
# ncu of the cross-entropy row kernel (ce_row_kernel) under bench_k3 at one shape: the full set
# (--page details), then the breakdowns its headline leaves out: the warp stall reasons (cycles per
# issued instruction, largest first), L2 sectors by operation and DRAM bytes read / written, so
# the L2 traffic above DRAM (issue #24: 85.9% L2 against 68.8% DRAM at 8192x50304) can be
# attributed to the bulk copies in, the streaming gradient stores or the atomics.
#   scripts/ncu-cross-entropy.sh [--bench BIN] [--out DIR] [--shape 8192x50304]
# Writes DIR/ncu_ce.txt (details) and DIR/ncu_ce_breakdown.txt, and prints the headline and the
# breakdowns.
set -euo pipefail
bench=build/gpu/bench/bench_k3
out=.
shape=8192x50304
while (($#)); do
  case "$1" in
    --bench) bench=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    *) echo "ncu-cross-entropy: unknown option $1 (expected --bench, --out, --shape)" >&2; exit 2 ;;
  esac
done
if [[ ! $shape =~ ^[0-9]+x[0-9]+$ ]]; then
  echo "ncu-cross-entropy: --shape must look like 8192x50304 (rows x vocab), got '$shape'" >&2
  exit 2
fi
[ -x "$bench" ] || { echo "ncu-cross-entropy: $bench not built" >&2; exit 2; }
mkdir -p "$out"
filter="--benchmark_filter=^cross_entropy/fwdbwd/$shape/"
# Skip the warm-up launches; one launch each.
ncu --set full -k regex:ce_row_kernel --launch-skip 3 -c 1 --page details "$bench" "$filter" >"$out/ncu_ce.txt" 2>&1 || true
ncu -k regex:ce_row_kernel --launch-skip 3 -c 1 --page details \
  --metrics 'regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,regex:^lts__t_sectors_op_(read|write|atom|red)\.sum$,regex:^lts__t_sectors_srcunit_tex_op_(read|write)\.sum$,regex:^dram__bytes_(read|write)\.sum$' \
  "$bench" "$filter" >"$out/ncu_ce_breakdown.txt" 2>&1 || true

echo "== ce_row_kernel at $shape"
grep -E "Duration|SM Frequency|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Block Limit Registers" \
  "$out/ncu_ce.txt" | head -20 || echo "(no headline metrics: see $out/ncu_ce.txt)"
echo "== stall reasons (warp cycles per issued instruction, largest first)"
grep -E "smsp__average_warps_issue_stalled_" "$out/ncu_ce_breakdown.txt" |
  awk '{v = $NF; gsub(",", "", v); n = $1; sub("smsp__average_warps_issue_stalled_", "", n); sub("_per_issue_active.ratio", "", n); print v, n}' |
  sort -gr | head -12 || echo "(none: see $out/ncu_ce_breakdown.txt)"
echo "== L2 sectors and DRAM bytes"
grep -E "lts__t_sectors_|dram__bytes_" "$out/ncu_ce_breakdown.txt" || echo "(none: see $out/ncu_ce_breakdown.txt)"
