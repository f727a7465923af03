#!/usr/bin/env bash
# End to end: `cutrain train --timing_report FILE --profile_steps A:B`. On the GPU: the report
# table (every phase, per-layer kernels folded to layer*, MFU lines) and its JSON (regions, steps,
# peaks, MFU per step), the loss identical to a run without the flags (timing changes nothing but
# graph replay); on the CPU: the notes, and bad --profile_steps values rejected.
#   profile_cli.sh CUTRAIN_BINARY cpu|cuda     (cuda: exits 77 = skipped when there is no GPU)
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu
small_size 3
common=(train --deepspeed_config configs/bf16_full.json --device "$device" "${size[@]}" --num_steps 8 --warmup_steps 2
        --log_interval 1 --seed 3 --loss_log_file)

for bad in 3 a:b -1:2 5:3 1:2:3; do
  if "$bin" "${common[@]}" "$tmp/bad.csv" --profile_steps="$bad" >"$tmp/bad.txt" 2>&1; then fail "--profile_steps $bad accepted"; fi
  grep -q -- "--profile_steps" "$tmp/bad.txt" || { cat "$tmp/bad.txt"; fail "--profile_steps $bad: message names no flag"; }
done

"$bin" "${common[@]}" "$tmp/plain.csv" >"$tmp/plain.txt" 2>&1 || { cat "$tmp/plain.txt"; fail "plain run"; }
out=$tmp/prof.txt
"$bin" "${common[@]}" "$tmp/prof.csv" --timing_report "$tmp/report.json" --timing_steps 3 --profile_steps 4:5 \
    >"$out" 2>&1 || { cat "$out"; fail "profiled run"; }
cmp -s "$tmp/plain.csv" "$tmp/prof.csv" || { paste "$tmp/plain.csv" "$tmp/prof.csv"; fail "losses differ with the profiling flags"; }
grep -q "FINAL RESULTS" "$out" || fail "FINAL RESULTS missing"
if [ "$device" = cpu ]; then
  grep -q -- "--timing_report: no report on the CPU backend" "$out" || { cat "$out"; fail "CPU timing note"; }
  grep -q -- "--profile_steps: ignored on the CPU backend" "$out" || { cat "$out"; fail "CPU profile note"; }
  [ -e "$tmp/report.json" ] && fail "CPU run wrote a report"
  "$bin" "${common[@]}" "$tmp/x.csv" --timing_report >/dev/null 2>&1 || fail "--timing_report without a file rejected"
  echo "profile_cli cpu: ok"; exit 0
fi
for row in "step " "step/h2d" "step/fwd/embedding" "step/fwd/layer\*/attn/qkv" "step/fwd/layer\*/attn/attention" \
           "step/fwd/layer\*/mlp/fc1" "step/fwd/head/cross_entropy" "step/bwd/head/dw" "step/bwd/layer\*/attn/attention" \
           "step/bwd/layer\*/mlp/fc1_dw" "step/bwd/embedding" "step/grad_norm" "step/optimizer" "MFU per step vs datasheet" \
           "MFU per step vs measured GEMM peak" "bf16 GEMM"; do
  grep -q "$row" "$out" || { cat "$out"; fail "report row '$row' missing"; }
done
grep -q "layer01" "$out" && fail "table not folded"
python3 - "$tmp/report.json" <<'PY' || fail "report JSON"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["steps"] == 3, j["steps"]
assert len(j["step_ms"]) == 3 and all(ms > 0 for ms in j["step_ms"]), j["step_ms"]
assert len(j["mfu_measured_peak"]) == 3 and all(0 < m < 1 for m in j["mfu_measured_peak"]), j["mfu_measured_peak"]
assert j["peaks"]["copy_gbps"] > 100 and j["peaks"]["gemm_tflops_measured"] > 10, j["peaks"]
names = {r["name"]: r for r in j["regions"]}
for l in range(3):
    for k in ("fwd/layer%02d/attn/qkv", "bwd/layer%02d/mlp/fc2_dx"):
        r = names["step/" + k % l]
        assert r["calls"] == 3 and r["tflops"] > 0 and r["total_ms"] > 0, r
assert names["step"]["calls"] == 3
assert 99.9 < names["step"]["pct_of_step"] < 100.1
assert names["step/optimizer"]["gbps"] > 0
kinds = {r["name"] for r in j["regions_by_kind"]}
assert "step/bwd/layer*/attn/attention" in kinds, kinds
PY
echo "profile_cli cuda: ok"
