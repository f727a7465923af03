#!/usr/bin/env bash
# End to end: runs the `cutrain` binary like the BF16 example's run_comparison.sh would and checks
# its output lines, the loss CSV, the metrics JSON, that the loss falls on a fixed batch, that a
# missing config is an error, --attention_backward and cutrain.attention_backward, and that
# `cutrain` with no arguments runs the default job.
#   train_cli.sh CUTRAIN_BINARY cpu|cuda     (cuda: exits 77 = skipped when there is no GPU)
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu
small_size

for cfg in baseline bf16_master_wg bf16_full; do
  out=$tmp/$cfg.txt
  "$bin" train --deepspeed_config configs/$cfg.json --device "$device" "${size[@]}" --num_steps 8 --warmup_steps 2 \
      --log_interval 3 --fixed_batch --learning_rate 1e-2 --seed 7 \
      --loss_log_file "$tmp/$cfg.csv" --metrics_file "$tmp/$cfg.jsonl" >"$out" 2>&1 || { cat "$out"; fail "$cfg run"; }
  grep -Eq '^\[Rank 0\] Model parameters: [0-9,]+ total, [0-9,]+ trainable$' "$out" || fail "$cfg: Model parameters line"
  grep -Eq '^\[Rank 0\] Memory after init: allocated=[0-9]+\.[0-9]{2} GB, reserved=[0-9]+\.[0-9]{2} GB$' "$out" || fail "$cfg: Memory line"
  for s in 0 3 6 7; do
    grep -Eq "^\[Rank 0\] Step $s: loss=[0-9]+\.[0-9]{4}, time=[0-9]+\.[0-9]{3}s, alloc_mem=[0-9.]+ GB, peak_mem=[0-9.]+ GB$" "$out" \
      || fail "$cfg: Step $s line"
  done
  grep -q "Step 1:" "$out" && fail "$cfg: Step 1 printed off the log interval"
  grep -q "FINAL RESULTS" "$out" || fail "$cfg: FINAL RESULTS"
  grep -Eq "^SUMMARY: config=configs/$cfg.json params=[0-9]+ peak_mem_bytes=[0-9]+ alloc_mem_bytes=[0-9]+ avg_step_time=[0-9]+\.[0-9]{4}$" "$out" \
    || fail "$cfg: SUMMARY line"
  [ "$(head -1 "$tmp/$cfg.csv")" = "step,loss" ] || fail "$cfg: CSV header"
  [ "$(wc -l <"$tmp/$cfg.csv")" -eq 9 ] || fail "$cfg: CSV rows"
  [ "$(wc -l <"$tmp/$cfg.jsonl")" -eq 8 ] || fail "$cfg: metrics rows"
  python3 - "$tmp/$cfg.csv" "$tmp/$cfg.jsonl" <<'PY' || fail "$cfg: loss did not fall / metrics malformed"
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
losses = [float(r["loss"]) for r in rows]
assert [int(r["step"]) for r in rows] == list(range(8)), rows
assert losses[-1] < losses[0] - 0.2, losses
for i, line in enumerate(open(sys.argv[2])):
    j = json.loads(line)
    assert j["step"] == i and abs(j["loss"] - losses[i]) < 1e-6 * max(1, losses[i]), (j, losses[i])
    for k in ("lr", "grad_norm", "step_time_s", "tokens_per_s", "allocated_bytes", "reserved_bytes", "peak_bytes"):
        assert k in j, k
PY
  echo "ok: $cfg ($device)"
done

# A missing --deepspeed_config (with other flags) is an error naming the flag.
if "$bin" train --num_steps 1 >"$tmp/noconf.txt" 2>&1; then fail "missing --deepspeed_config accepted"; fi
grep -q "deepspeed_config" "$tmp/noconf.txt" || { cat "$tmp/noconf.txt"; fail "missing-config message"; }
# A config error surfaces with the loader's message (file named).
echo '{"optimizer": {"type": "AdamW", "params": {"lr": "fast"}}}' >"$tmp/bad.json"
if "$bin" train --deepspeed_config "$tmp/bad.json" --device cpu >"$tmp/bad.txt" 2>&1; then fail "bad config accepted"; fi
grep -q "bad.json" "$tmp/bad.txt" || { cat "$tmp/bad.txt"; fail "config error message"; }

# --save_mode takes auto, async or sync; another value is refused before any work.
if "$bin" train --deepspeed_config configs/baseline.json --device cpu --save "$tmp/ck" --save_mode later \
    >"$tmp/mode.txt" 2>&1; then fail "--save_mode later accepted"; fi
grep -q -- '--save_mode: expected one of "auto", "async", "sync", found "later"' "$tmp/mode.txt" \
  || { cat "$tmp/mode.txt"; fail "--save_mode message"; }
[ ! -e "$tmp/ck" ] || fail "--save_mode error left a checkpoint folder"

# --attention_backward (else the config's cutrain.attention_backward): fast is named with its
# source; the flag wins over the config; a bad value is refused naming the flag or the key.
python3 - "$tmp" <<'PY'
import json, sys
c = json.load(open("configs/baseline.json"))
json.dump(dict(c, cutrain={"attention_backward": "fast"}), open(sys.argv[1] + "/fast.json", "w"))
json.dump(dict(c, cutrain={"attention_backward": "atomic"}), open(sys.argv[1] + "/atomic.json", "w"))
PY
if [ "$device" = cuda ]; then fast_note="dQ by order-dependent fp32 reduce-adds, not bit-reproducible run to run"
else fast_note="applies to --device cuda; the CPU reference's backward is deterministic"; fi
ab_run() { "$bin" train --device "$device" "${size[@]}" --num_steps 2 --warmup_steps 1 "$@"; }
ab_run --deepspeed_config configs/baseline.json --attention_backward fast >"$tmp/ab1.txt" 2>&1 \
  || { cat "$tmp/ab1.txt"; fail "--attention_backward fast run"; }
grep -qF "[Rank 0] Attention backward: fast (--attention_backward fast): $fast_note" "$tmp/ab1.txt" \
  || { cat "$tmp/ab1.txt"; fail "--attention_backward fast not named"; }
ab_run --deepspeed_config "$tmp/fast.json" >"$tmp/ab2.txt" 2>&1 || { cat "$tmp/ab2.txt"; fail "config's fast run"; }
grep -qF "[Rank 0] Attention backward: fast ($tmp/fast.json: cutrain.attention_backward \"fast\"): $fast_note" \
  "$tmp/ab2.txt" || { cat "$tmp/ab2.txt"; fail "the config's cutrain.attention_backward not named"; }
ab_run --deepspeed_config "$tmp/fast.json" --attention_backward deterministic >"$tmp/ab3.txt" 2>&1 \
  || { cat "$tmp/ab3.txt"; fail "--attention_backward deterministic run"; }
grep -q "Attention backward" "$tmp/ab3.txt" && fail "--attention_backward deterministic did not win over the config"
if ab_run --deepspeed_config configs/baseline.json --attention_backward quick >"$tmp/ab4.txt" 2>&1; then
  fail "--attention_backward quick accepted"
fi
grep -q -- "--attention_backward: quick not in {deterministic,fast}" "$tmp/ab4.txt" \
  || { cat "$tmp/ab4.txt"; fail "--attention_backward message"; }
if ab_run --deepspeed_config "$tmp/atomic.json" >"$tmp/ab5.txt" 2>&1; then fail "cutrain.attention_backward atomic accepted"; fi
grep -qF "atomic.json: cutrain.attention_backward: expected one of \"deterministic\", \"fast\", found string \"atomic\"" \
  "$tmp/ab5.txt" || { cat "$tmp/ab5.txt"; fail "cutrain.attention_backward message"; }

if [ "$device" = cpu ]; then
  # No arguments, no GPU visible: the small CPU run of the default job, saying so.
  CUDA_VISIBLE_DEVICES= "$bin" >"$tmp/default.txt" 2>&1 || { cat "$tmp/default.txt"; fail "default run"; }
  grep -q "small run on the CPU" "$tmp/default.txt" || fail "default run did not say it runs on the CPU"
  grep -q "^SUMMARY: config=configs/bf16_full.json" "$tmp/default.txt" || fail "default run SUMMARY"
  echo "ok: default run"
fi
echo "PASS"
