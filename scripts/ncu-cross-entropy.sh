#!/usr/bin/env bash
# ncu of the cross-entropy row kernel (ce_row_kernel) under bench_k3 at one shape: the full set
# (--page details) with the breakdowns its headline leaves out: the warp stall reasons (cycles per
# issued instruction, largest first), L2 sectors by operation and DRAM bytes read / written, so
# the L2 traffic above DRAM (issue #24: 85.9% L2 against 68.8% DRAM at 8192x50304) can be
# attributed to the bulk copies in, the streaming gradient stores or the atomics.
#   scripts/ncu-cross-entropy.sh [--bench BIN] [--out DIR] [--shape 8192x50304]
# Writes DIR/ncu_ce.txt (details) and prints the headline and the breakdowns.
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
# One launch after the warm-up: the full set plus the breakdowns it leaves out.
metrics="$(python3 scripts/ncu_summary.py --print-stall-metrics),regex:^lts__t_sectors_op_(read|write|atom|red)\.sum\$,regex:^lts__t_sectors_srcunit_tex_op_(read|write)\.sum\$,regex:^dram__bytes_(read|write)\.sum\$"
# The L2 sectors that neither the SMs' L1/TEX nor DRAM account for (a third of them at 8192x50304
# on the H100): the traffic between the L2's two partitions, where this GPU's ncu has the counter.
# (grep reads all of ncu's list, not -q: under pipefail ncu's SIGPIPE would read as no match.)
if ncu --query-metrics 2>/dev/null | grep -E '(^|[[:space:]])lts__t_sectors_srcunit_ltcfabric([[:space:]]|$)' >/dev/null; then
  metrics="$metrics,regex:^lts__t_sectors_srcunit_ltcfabric(_op_(read|write))?\.sum\$"
fi
ncu --set full --metrics "$metrics" -k regex:ce_row_kernel --launch-skip 3 -c 1 --page details "$bench" "$filter" \
  >"$out/ncu_ce.txt" 2>&1 || true

echo "== ce_row_kernel at $shape"
grep -E "Duration|SM Frequency|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Block Limit Registers" \
  "$out/ncu_ce.txt" | head -20 || echo "(no headline metrics: see $out/ncu_ce.txt)"
echo "== stall reasons (warp cycles per issued instruction, largest first)"
python3 scripts/ncu_summary.py --stalls --top 12 "$out/ncu_ce.txt" || true
echo "== L2 sectors and DRAM bytes"
grep -E "lts__t_sectors_|dram__bytes_" "$out/ncu_ce.txt" || echo "(none: see $out/ncu_ce.txt)"
