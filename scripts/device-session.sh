#!/usr/bin/env bash
# Prepared by scripts/device-snapshot.sh (run it from .snap/). One call on the lent GPU machine, in order of importance, under a global deadline so that a run
# cut short still returns what it measured: build + every test (scripts/gpu-check.sh), the main job
# and its PyTorch peer (the comparison run), the 6.86B model, the llm.c shape, kernel benchmarks and
# their PyTorch peers, real-data training, the offload sweep, the I/O tools, an ncu capture.
#   OUT=... scripts/device-session.sh [--budget SECONDS] [--skip LIST]
# Logs go to $OUT/logs (tarred into $OUT/logs.tar.gz at the end) and a summary to $OUT/summary.txt.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
budget=560; skip=""
while (($#)); do
  case "$1" in
    --budget) budget=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    *) echo "device-session: unknown option $1" >&2; exit 2 ;;
  esac
done
export OUT=${OUT:-$root/build/device-session}
t_end=$(( $(date +%s) + budget ))
logs=$OUT/logs
mkdir -p "$logs"
sum=$OUT/summary.txt
left() { echo $(( t_end - $(date +%s) )); }
# step NAME LIMIT CMD...: runs CMD with min(LIMIT, time left - 15 s), logs to logs/NAME.txt
step() {
  local name=$1 limit=$2; shift 2
  case ",$skip," in *",$name,"*) echo "-- $name: skipped" >>"$sum"; return ;; esac
  local l; l=$(( $(left) - 15 )); (( l < limit )) && limit=$l
  if (( limit < 5 )); then echo "-- $name: no time left" >>"$sum"; return; fi
  local t0; t0=$(date +%s)
  timeout "$limit" bash -c "$*" >"$logs/$name.txt" 2>&1
  local rc=$?
  echo "-- $name: rc=$rc in $(( $(date +%s) - t0 )) s" >>"$sum"
}
bin=build/gpu/tools/cutrain
export CTEST_JOBS=${CTEST_JOBS:-12}

# 1. Build and every test (gpu-check keeps its own logs under $OUT/logs and summary.txt).
OUT=$OUT/check scripts/gpu-check.sh --bench none >"$logs/gpu-check.txt" 2>&1
echo "-- gpu-check rc=$? ($(( budget - $(left) )) s so far)" >>"$sum"
cat "$OUT/check/summary.txt" >>"$sum" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >>"$sum" 2>&1

# 2. Attention variant: the fastest correct one at the BF16 example's shape, measured now.
step bench_attention 60 "build/gpu/bench/bench_attention --benchmark_filter='fwdbwd' --benchmark_out=$logs/bench_attention_fwdbwd.json --benchmark_out_format=json --benchmark_counters_tabular=true"
best=$(python3 - "$logs/bench_attention_fwdbwd.json" <<'PY' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))
t = {}
for b in d["benchmarks"]:
    n = b["name"].split("/manual_time")[0].split("/iterations")[0]
    if "/B4H16S512D64" in n and n.startswith("attention/fwdbwd/"):
        t[n.split("@")[1] if "@" in n else "default"] = b["median_us"]
print(min(t, key=t.get) if t else "")
PY
)
[ -n "$best" ] && [ "$best" != default ] && export CUTRAIN_ATTN_VARIANT=$best
echo "-- attention variant for the training runs: ${CUTRAIN_ATTN_VARIANT:-default}" >>"$sum"

# 3. The main job and its peer: three layouts at the BF16 example's defaults.
step comparison 150 "OUT=$OUT/cmp PEER_MODES=eager scripts/run-comparison.sh --bin $bin --with-peer"
tail -30 "$logs/comparison.txt" >>"$sum" 2>/dev/null
step train_6p86b 90 "for c in baseline bf16_full; do $bin train --deepspeed_config configs/\$c.json --hidden_dim 4096 --num_layers 32 --num_heads 32 --batch_size 1 --seq_length 512 --activation_checkpointing --num_steps 4 --warmup_steps 1 --log_interval 1 | grep -E 'parameters|Memory after|Step|SUMMARY'; done"
grep -E "SUMMARY|Model parameters" "$logs/train_6p86b.txt" >>"$sum" 2>/dev/null
step train_llmc_shape 45 "$bin train --deepspeed_config configs/baseline.json --hidden_dim 768 --num_layers 12 --num_heads 12 --vocab_size 50257 --seq_length 1024 --batch_size 16 --num_steps 15 --warmup_steps 5 | tail -3"
grep SUMMARY "$logs/train_llmc_shape.txt" >>"$sum" 2>/dev/null

# 4. Kernel benchmarks (all variants) and their PyTorch peers, then the ratio table.
for b in attention dense k3 offload gemm allocator; do
  [ -x build/gpu/bench/bench_$b ] || continue
  step bench_$b 70 "build/gpu/bench/bench_$b --benchmark_out=$logs/bench_$b.json --benchmark_out_format=json --benchmark_counters_tabular=true"
done
for p in attention dense k3 offload; do
  [ -e bench/peers/${p}_peer.py ] && step peer_$p 60 "python3 bench/peers/${p}_peer.py --out $logs/${p}_peer.json"
done
python3 bench/peers/compare.py --ours "$logs"/bench_*.json --peers "$logs"/*_peer.json >"$logs/compare.md" 2>&1
cat "$logs/compare.md" >>"$sum"

# 5. Real data, offload sweep, I/O tools, an ncu capture.
step real_data 90 "$bin prepare-data --input .devdata/wikitext-2/valid.txt .devdata/wikitext-2/test.txt --vocab .devdata/gpt2/encoder.json --merges .devdata/gpt2/vocab.bpe --output /tmp/wt2 --val_fraction 0.1 && ls /tmp/wt2* && $bin train --deepspeed_config configs/bf16_full.json --use_real_data --data '/tmp/wt2_train_*.bin' --next_token_labels --num_steps 300 --log_interval 25 --loss_log_file $logs/real_data_loss.csv | grep -E 'Step|SUMMARY|eval|val'"
step offload_sweep 60 "scripts/offload-sweep.sh --trials 2 --cutrain $bin -- --hidden_dim 8192 --nlayers 1; $bin offload-bench --hidden_dim 16384 --nlayers 4 --pin_memory --iteration 3 --warmup 1 | tail -6"
step io 90 "mkdir -p /tmp/io && $bin io-bench --folder /tmp/io --io_size 1G --read --loops 3 && $bin io-bench --folder /tmp/io --io_size 1G --loops 3 && $bin io-bench --folder /tmp/io --io_size 1G --read --gpu --loops 3 --no_baselines && $bin file-access --folder /tmp/io --size 1G && $bin nvme-tune --folder /tmp/io --io_size 256M --io_parallel 1 4"
step timing_report 45 "if $bin train --help | grep -q timing_report; then $bin train --deepspeed_config configs/bf16_full.json --num_steps 8 --timing_report $logs/timing_report.json; else echo 'no --timing_report in this build'; fi"
tail -45 "$logs/timing_report.txt" >>"$sum" 2>/dev/null
# ncu: with --profile_steps when the build has it (capture exactly steps 3-4), else a window of
# launches in the third step.
step ncu 75 "if $bin train --help | grep -q profile_steps; then ncu --clock-control none --profile-from-start off --section SpeedOfLight --csv $bin train --deepspeed_config configs/bf16_full.json --num_steps 5 --profile_steps 3:4 --no_cuda_graph; else ncu --clock-control none --launch-skip 400 --launch-count 60 --section SpeedOfLight --csv $bin train --deepspeed_config configs/bf16_full.json --num_steps 3 --no_cuda_graph; fi > $logs/ncu.csv; tail -5 $logs/ncu.csv; wc -l $logs/ncu.csv"
echo "-- done, $(( budget - $(left) )) s used" >>"$sum"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs check cmp 2>/dev/null && rm -rf "$logs" "$OUT/check/logs"
