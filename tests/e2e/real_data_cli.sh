#!/usr/bin/env bash
# End to end, real text: `cutrain prepare-data` on a slice of WikiText-2 valid, then `cutrain train
# --use_real_data` with validation shards: next-token labels and causal attention by default, the
# Eval lines, val_loss/val_ppl in the metrics and the SUMMARY line, a validation loss that falls,
# --pad_vocab, --labels identity (the BF16 example's objective), and the input errors.
#   real_data_cli.sh CUTRAIN_BINARY cpu|cuda   (exits 77 = skipped: no GPU for cuda, or no data)
source "$(dirname "$0")/e2e_lib.sh"
wikitext_data_or_skip
skip_without_gpu

head -c 120000 "$data/wikitext-2/valid.txt" >"$tmp/text.txt"
"$bin" prepare-data --input "$tmp/text.txt" --vocab "$data/gpt2/encoder.json" --merges "$data/gpt2/vocab.bpe" \
    --output "$tmp/wt" --val_fraction 0.2 >"$tmp/prep.txt" 2>&1 || { cat "$tmp/prep.txt"; fail "prepare-data"; }
ls "$tmp"/wt_train_*.bin "$tmp"/wt_val_*.bin >/dev/null || fail "shards not written"

if [ "$device" = cuda ]; then
  steps=60; every=20
  size=(--hidden_dim 256 --num_heads 4 --num_layers 2 --seq_length 64 --batch_size 8
        --eval_steps 4 --learning_rate 2e-3)
else
  steps=8; every=4
  size=(--hidden_dim 32 --num_heads 2 --num_layers 1 --seq_length 16 --batch_size 2
        --eval_steps 2 --learning_rate 1e-2)
fi
run() { "$bin" train --deepspeed_config configs/bf16_master_wg.json --device "$device" --use_real_data \
          --data "$tmp/wt_train_*.bin" --eval_data "$tmp/wt_val_*.bin" "${size[@]}" --log_interval 4 --seed 3 "$@"; }

run --num_steps "$steps" --eval_interval "$every" --pad_vocab --metrics_file "$tmp/m.jsonl" >"$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt"; fail "real-data run"; }
grep -q "Objective: next-token labels, causal attention" "$tmp/out.txt" || fail "default objective is not next-token + causal"
grep -q -- "--pad_vocab 64: 50257 -> 50304 rows" "$tmp/out.txt" || fail "pad_vocab line"
grep -Eq "^\[Rank 0\] Eval before training: val_loss=[0-9.]+, val_ppl=[0-9.]+ \([0-9]+ batches" "$tmp/out.txt" \
  || fail "Eval before training line"
grep -Eq "^\[Rank 0\] Eval after step [0-9]+: val_loss=" "$tmp/out.txt" || fail "Eval after step line"
grep -Eq "^SUMMARY: .* avg_step_time=[0-9.]+ val_loss=[0-9.]+ val_ppl=[0-9.]+$" "$tmp/out.txt" || fail "SUMMARY extension"
python3 - "$tmp/out.txt" "$tmp/m.jsonl" <<'PY' || { cat "$tmp/out.txt"; fail "validation loss did not fall / metrics"; }
import json, math, re, sys
text = open(sys.argv[1]).read()
vals = [float(v) for v in re.findall(r"Eval [^:]*: val_loss=([0-9.]+)", text)]
assert len(vals) >= 3, vals
assert vals[-1] < vals[0] - 0.5, vals            # it learns the text
assert abs(vals[0] - math.log(50257)) < 1.5, vals  # starts near uniform over GPT-2's vocabulary
rows = [json.loads(l) for l in open(sys.argv[2])]
ev = [r for r in rows if "val_loss" in r]
assert len(ev) == len(vals) - 1, (len(ev), vals)
for r in ev:
    assert abs(r["val_ppl"] - math.exp(r["val_loss"])) < 1e-3 * r["val_ppl"], r
PY
echo "ok: next-token real data with validation ($device)"

# Resume mid-stream: 3 steps + save, then 3 more from the checkpoint, give the losses of 6 straight
# steps (the loader restarts at the checkpoint's batch).
run --num_steps 6 --loss_log_file "$tmp/straight.csv" >"$tmp/s.txt" 2>&1 || { cat "$tmp/s.txt"; fail "straight run"; }
run --num_steps 3 --save "$tmp/ck" >"$tmp/a.txt" 2>&1 || { cat "$tmp/a.txt"; fail "first half"; }
run --num_steps 3 --resume "$tmp/ck" --loss_log_file "$tmp/resumed.csv" >"$tmp/b.txt" 2>&1 \
  || { cat "$tmp/b.txt"; fail "resumed half"; }
[ "$(tail -n 3 "$tmp/straight.csv")" = "$(tail -n 3 "$tmp/resumed.csv")" ] \
  || { paste "$tmp/straight.csv" "$tmp/resumed.csv"; fail "resumed losses differ from the straight run"; }
echo "ok: resume continues the data stream"

# --labels identity: the BF16 example's objective (labels = inputs, no mask).
run --num_steps 2 --labels identity >"$tmp/id.txt" 2>&1 || { cat "$tmp/id.txt"; fail "--labels identity run"; }
grep -q "Objective: labels = input ids, bidirectional attention" "$tmp/id.txt" || fail "identity objective line"

# Input errors name the flag or file.
expect_error() {  # expect_error WHAT PATTERN ARGS...
  local what=$1 pat=$2; shift 2
  if "$bin" train --deepspeed_config configs/bf16_full.json --device "$device" "$@" >"$tmp/err.txt" 2>&1; then
    fail "$what accepted"
  fi
  grep -q -- "$pat" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "$what: message lacks '$pat'"; }
}
expect_error "--eval_data without --use_real_data" "--eval_data needs --use_real_data" --eval_data "$tmp/wt_val_*.bin"
expect_error "--labels without real data" "--labels identity applies to --use_real_data" --labels identity
expect_error "an eval pattern matching nothing" "$tmp/nothing_" --use_real_data --data "$tmp/wt_train_*.bin" \
  --eval_data "$tmp/nothing_*.bin"
printf 'garbage that is not a shard header' >"$tmp/bad_val_000000.bin"
expect_error "a bad eval shard" "bad_val_000000.bin" --use_real_data --data "$tmp/wt_train_*.bin" \
  --eval_data "$tmp/bad_val_*.bin"
echo "PASS"
