#!/usr/bin/env bash
# End to end: the logs of a run as it goes. stdout reaches a pipe line by line while the run is
# on; the loss CSV and the metrics JSONL hold every completed step's line after a SIGKILL
# mid-run; no progress line when stdout is not a terminal; a log in a missing folder fails before
# the first step naming the flag and the path; errors carry no source location unless
# CUTRAIN_DEBUG=1; `cutrain check-config` prints the warnings of keys not acted on, accepts fp16 and
# refuses it with bf16; --version.
#   logs_cli.sh CUTRAIN_BINARY cpu|cuda     (cuda: exits 77 = skipped when there is no GPU)
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu
if [ "$device" = cuda ]; then
  size=(--hidden_dim 256 --num_heads 4 --num_layers 4 --vocab_size 1000 --seq_length 128 --batch_size 4)
else
  size=(--hidden_dim 64 --num_heads 2 --num_layers 2 --vocab_size 256 --seq_length 32 --batch_size 2)
fi

# SIGKILL mid-run: stdout (a file, so not a terminal) already has the Step lines, the CSV and the
# JSONL one line per completed step.
"$bin" train --deepspeed_config configs/baseline.json --device "$device" "${size[@]}" --num_steps 1000000 \
    --log_interval 1 --seed 5 --loss_log_file "$tmp/loss.csv" --metrics_file "$tmp/metrics.jsonl" \
    >"$tmp/out.txt" 2>&1 &
pid=$!
for _ in $(seq 600); do
  [ -f "$tmp/metrics.jsonl" ] && [ "$(wc -l <"$tmp/metrics.jsonl")" -ge 5 ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/out.txt"; fail "the run ended before it was killed"; }
  sleep 0.1
done
kill -KILL "$pid"
wait "$pid" 2>/dev/null && fail "the killed run exited 0"
grep -Eq '^\[Rank 0\] Step 3: loss=' "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "stdout was not written line by line"; }
grep -q $'\r' "$tmp/out.txt" && fail "a progress line went to a file"
grep -q "ETA" "$tmp/out.txt" && fail "a progress line went to a file"
python3 - "$tmp/loss.csv" "$tmp/metrics.jsonl" <<'PY' || fail "logs after SIGKILL"
import json, math, sys
csv_text = open(sys.argv[1]).read()
jsonl_text = open(sys.argv[2]).read()
assert csv_text.endswith("\n") and jsonl_text.endswith("\n"), "a partial line"
rows = csv_text.splitlines()
assert rows[0] == "step,loss", rows[0]
steps = []
for r in rows[1:]:
    s, l = r.split(",")
    assert math.isfinite(float(l)), r
    steps.append(int(s))
assert steps == list(range(len(steps))), steps
metrics = [json.loads(line) for line in jsonl_text.splitlines()]
m_steps = [m["step"] for m in metrics]
assert m_steps == list(range(len(m_steps))), m_steps
# A step's CSV line is written before its metrics line: the step being killed may have the first.
assert len(steps) - len(m_steps) in (0, 1), (len(steps), len(m_steps))
assert len(m_steps) >= 5, m_steps
print(f"ok: {len(steps)} CSV rows, {len(m_steps)} metrics lines after SIGKILL")
PY

# A log in a folder that does not exist: an error naming the flag and the path, before any step.
for flag in --loss_log_file --metrics_file; do
  if "$bin" train --deepspeed_config configs/baseline.json --device "$device" "${size[@]}" --num_steps 2 \
      "$flag" "$tmp/no/such/dir/log" >"$tmp/nodir.txt" 2>&1; then fail "$flag in a missing folder accepted"; fi
  grep -q -- "$flag $tmp/no/such/dir/log" "$tmp/nodir.txt" || { cat "$tmp/nodir.txt"; fail "$flag: message"; }
  grep -q "Step 0" "$tmp/nodir.txt" && fail "$flag: the run started before the log was checked"
done
# No source location in the error, unless CUTRAIN_DEBUG=1.
grep -Eq '\.(cpp|cu|h):[0-9]+' "$tmp/nodir.txt" && { cat "$tmp/nodir.txt"; fail "source location in a user error"; }
CUTRAIN_DEBUG=1 "$bin" train --deepspeed_config configs/baseline.json --device "$device" "${size[@]}" --num_steps 2 \
    --metrics_file "$tmp/no/such/dir/log" >"$tmp/debug.txt" 2>&1 && fail "missing folder accepted (debug)"
grep -Eq 'line_log\.cpp:[0-9]+\]$' "$tmp/debug.txt" || { cat "$tmp/debug.txt"; fail "CUTRAIN_DEBUG=1: no source location"; }

# check-config names the keys read but not acted on, accepts fp16 alone (fp16 training) and refuses
# fp16 with bf16, naming both keys.
echo '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e9}}' >"$tmp/w.json"
"$bin" check-config "$tmp/w.json" >"$tmp/cc.txt" 2>&1 || { cat "$tmp/cc.txt"; fail "check-config"; }
grep -q "^warning: config key zero_optimization.stage3_max_live_parameters is read but not acted on (" "$tmp/cc.txt" \
  || { cat "$tmp/cc.txt"; fail "check-config: warning"; }
grep -q "OK (1 warning)" "$tmp/cc.txt" || { cat "$tmp/cc.txt"; fail "check-config: count"; }
echo '{"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true}}' >"$tmp/fp16.json"
"$bin" check-config "$tmp/fp16.json" >"$tmp/fp16.txt" 2>&1 || { cat "$tmp/fp16.txt"; fail "fp16.enabled: true refused"; }
grep -q "OK (0 warnings)" "$tmp/fp16.txt" || { cat "$tmp/fp16.txt"; fail "check-config fp16: count"; }
echo '{"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true}, "bf16": {"enabled": true}}' >"$tmp/both.json"
"$bin" check-config "$tmp/both.json" >"$tmp/both.txt" 2>&1 && fail "fp16 with bf16 accepted"
grep -q "fp16.enabled: fp16.enabled and bf16.enabled are both true" "$tmp/both.txt" || { cat "$tmp/both.txt"; fail "fp16 + bf16 message"; }

# --version: version, commit, CUDA runtime, architectures; exit 0.
"$bin" --version >"$tmp/version.txt" || fail "--version exit code"
grep -Eq '^cutrain [0-9]+\.[0-9]+\.[0-9]+ \([^,]+, CUDA [0-9]+\.[0-9]+, sm_[0-9]+' "$tmp/version.txt" \
  || { cat "$tmp/version.txt"; fail "--version line"; }
echo "PASS"
