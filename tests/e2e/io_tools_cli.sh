#!/usr/bin/env bash
# DeepNVMe's tools as their users know them, through the `cutrain` binary, on small files in a
# temp folder: io-bench with ds_io's flags and its GB/sec (1024^3) lines; nvme-tune with
# ds_nvme_tune's flags (--nvme_dir, --sweep_config, --no_read, --no_write, --log_dir), its per-run
# logs and the complete {"aio": ...} block; errors naming the flag or file. The cuda variant also
# runs io-bench and nvme-tune with GPU buffers.
#   io_tools_cli.sh CUTRAIN_BINARY cpu|cuda
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu
mkdir "$tmp/io"
gpu=(); [ "$device" = cuda ] && gpu=(--gpu)

# --- io-bench: ds_io's flags ---
"$bin" io-bench --folder "$tmp/io" --io_size 4M --block_size 1M --queue_depth 8 --io_parallel 2 --loops 1 \
  --handle --threads 2 --single_submit --sequential_requests --validate "${gpu[@]}" >"$tmp/w.txt" 2>&1 \
  || { cat "$tmp/w.txt"; fail "io-bench write"; }
grep -q "GB/sec = 1024^3 bytes per second" "$tmp/w.txt" || { cat "$tmp/w.txt"; fail "unit line"; }
grep -Eq "^Task Write Speed = [0-9]+\.[0-9]+ GB/sec$" "$tmp/w.txt" || { cat "$tmp/w.txt"; fail "Task Write line"; }
grep -Eq "^E2E Write Speed = [0-9]+\.[0-9]+ GB/sec$" "$tmp/w.txt" || { cat "$tmp/w.txt"; fail "E2E Write line"; }
grep -q "io-bench: write 2 x 4194304 bytes" "$tmp/w.txt" || { cat "$tmp/w.txt"; fail "--threads 2: two files"; }
"$bin" io-bench --folder_to_device_mapping "$tmp/io:0" --io_size 4M --read --loops 2 "${gpu[@]}" >"$tmp/r.txt" 2>&1 \
  || { cat "$tmp/r.txt"; fail "io-bench read with baselines"; }
grep -Eq "^Task Read Speed = [0-9]+\.[0-9]+ GB/sec$" "$tmp/r.txt" || { cat "$tmp/r.txt"; fail "Task Read line"; }
grep -Eq "^Baseline buffered Read Speed = [0-9]+\.[0-9]+ GB/sec" "$tmp/r.txt" || { cat "$tmp/r.txt"; fail "baseline line"; }
expect_error() {  # expect_error 'message part' cutrain-args...
  local want=$1; shift
  if "$bin" "$@" >"$tmp/err.txt" 2>&1; then fail "accepted: $*"; fi
  grep -qF -- "$want" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "message for $* lacks: $want"; }
}
expect_error "--folder_to_device_mapping '$tmp/io:x': expected FOLDER:GPU_INDEX with a GPU index >= 0, found 'x'" \
  io-bench --folder_to_device_mapping "$tmp/io:x" --io_size 1M
expect_error "--io_size: expected a size in bytes with an optional K, M or G suffix (powers of 1024), such as 1M, found '4X'" \
  io-bench --folder "$tmp/io" --io_size 4X
expect_error "--use_gds: expected" io-bench --folder "$tmp/io" --io_size 1M --use_gds
if [ "$device" = cpu ]; then  # with no GPU visible (also on a machine that has one)
  CUDA_VISIBLE_DEVICES= expect_error "--gpu: expected a CUDA device" io-bench --folder "$tmp/io" --io_size 1M --gpu
  CUDA_VISIBLE_DEVICES= expect_error "--gds: expected a CUDA device" nvme-tune --nvme_dir "$tmp/io" --io_size 1M --gds
fi

# --- nvme-tune: a sweep config, per-run logs, the aio block ---
cat >"$tmp/sweep.json" <<'JSON'
{"block_size": ["256K", "1M"], "queue_depth": [4], "io_parallel": [1], "single_submit": [false],
 "overlap_events": [true]}
JSON
"$bin" nvme-tune --nvme_dir "$tmp/io" --io_size 2M --sweep_config "$tmp/sweep.json" --log_dir "$tmp/logs" \
  "${gpu[@]}" >"$tmp/tune.txt" 2>&1 || { cat "$tmp/tune.txt"; fail "nvme-tune"; }
[ "$(grep -c '^read  block_size=' "$tmp/tune.txt")" = 2 ] || { cat "$tmp/tune.txt"; fail "two read runs"; }
[ "$(grep -c '^write block_size=' "$tmp/tune.txt")" = 2 ] || { cat "$tmp/tune.txt"; fail "two write runs"; }
for f in read_block_overlap_p1_d4_bs256K read_block_overlap_p1_d4_bs1M write_block_overlap_p1_d4_bs256K \
         write_block_overlap_p1_d4_bs1M; do
  [ -f "$tmp/logs/$f.txt" ] || { ls "$tmp/logs"; fail "log $f.txt missing"; }
done
grep -Eq "^Task Read Speed = [0-9.]+ GB/sec$" "$tmp/logs/read_block_overlap_p1_d4_bs1M.txt" || fail "log content"
sed -n '/^{/,/^}/p' "$tmp/tune.txt" >"$tmp/block.json"
python3 - "$tmp/block.json" "$device" <<'PY' || { cat "$tmp/tune.txt"; fail "the aio block"; }
import json, sys
b = json.load(open(sys.argv[1]))
assert list(b) == ["aio"], b
a = b["aio"]
assert set(a) == {"block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events", "use_gds"}, a
assert a["block_size"] in (262144, 1048576) and a["queue_depth"] == 4 and a["intra_op_parallelism"] == 1, a
assert a["single_submit"] is False and a["overlap_events"] is True and a["use_gds"] is False, a
PY
# --no_write with the --folder alias; the block then comes from the reads.
"$bin" nvme-tune --folder "$tmp/io" --io_size 1M --sweep_config "$tmp/sweep.json" --no_write --queue_depth 2 \
  "${gpu[@]}" >"$tmp/tune_r.txt" 2>&1 || { cat "$tmp/tune_r.txt"; fail "nvme-tune --no_write"; }
grep -q "^write" "$tmp/tune_r.txt" && fail "--no_write ran writes"
grep -q '"queue_depth": 2' "$tmp/tune_r.txt" || { cat "$tmp/tune_r.txt"; fail "--queue_depth replaces the sweep's list"; }
"$bin" nvme-tune --nvme_dir "$tmp/io" --io_size 1M --sweep_config "$tmp/sweep.json" --no_read \
  "${gpu[@]}" >"$tmp/tune_w.txt" 2>&1 || { cat "$tmp/tune_w.txt"; fail "nvme-tune --no_read"; }
grep -q "DeepSpeed config block (best write)" "$tmp/tune_w.txt" || { cat "$tmp/tune_w.txt"; fail "--no_read block"; }
echo '{"queue_depth": 8}' >"$tmp/bad_sweep.json"
expect_error "$tmp/bad_sweep.json: queue_depth: expected a non-empty list of integers >= 1, found number 8" \
  nvme-tune --nvme_dir "$tmp/io" --sweep_config "$tmp/bad_sweep.json"
expect_error "--sweep_config $tmp/none.json: expected a JSON file" nvme-tune --nvme_dir "$tmp/io" --sweep_config "$tmp/none.json"
expect_error "--no_read and --no_write: expected at most one of them, found both" \
  nvme-tune --nvme_dir "$tmp/io" --no_read --no_write
expect_error "--nvme_dir $tmp/nothere: expected a writable folder" nvme-tune --nvme_dir "$tmp/nothere"
echo "PASS"
