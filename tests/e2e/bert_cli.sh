#!/usr/bin/env bash
# BERT pre-training end to end (docs/bert.md): a tiny BERT (configs/bert_tiny.json's
# DeepSpeedTransformerConfig fields; on the GPU hidden 128 / 2 heads, as attention needs head_dim 64)
# with LAMB (configs/bert_tiny_lamb.json) on masked-LM batches cut from small token shards: the loss
# is finite and falls over 20 steps, with validation on other shards; a run saved at step 3 and
# resumed reproduces the uninterrupted run's losses; synthetic batches train; bing_bert's file
# format loads; and the errors: fp16 in the model file against bf16, fp16 on the CPU backend, an
# unknown key, heads not dividing hidden,
# batch_size against the micro-batch, a sequence past the position table, --model bert without
# --bert_config, a BERT flag without --model bert, a shape flag against the file. --pad_to_longest
# (issue #20): the padded lengths and a resume.
#   bert_cli.sh CUTRAIN_BINARY cpu|cuda     (cuda: skipped without a GPU)
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu

# Shards: documents of 5-60 tokens separated by EOT (50256); each document walks a small cycle of
# token ids, so masked tokens are predictable from their neighbours and the loss can fall.
python3 - "$tmp" <<'PY'
import random, struct, sys
def shard(path, n_docs, seed):
    rng = random.Random(seed)
    toks = []
    for _ in range(n_docs):
        start, step = rng.randrange(200), rng.choice([1, 2, 3])
        toks += [(start + step * i) % 200 + 100 for i in range(rng.randrange(5, 61))] + [50256]
    header = [20240520, 1, len(toks)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack(f"<{len(toks)}H", *toks))
shard(sys.argv[1] + "/train_000.bin", 300, 1)
shard(sys.argv[1] + "/train_001.bin", 300, 2)
shard(sys.argv[1] + "/val_000.bin", 60, 3)
PY

# The model config: the repository's tiny one, on the GPU with head_dim 64.
model="configs/bert_tiny.json"
seq=32
if [ "$device" = cuda ]; then
  python3 - "$tmp/bert_gpu.json" <<'PY'
import json, sys
c = json.load(open("configs/bert_tiny.json"))
c.update(hidden_size=128, heads=2, intermediate_size=512)
json.dump(c, open(sys.argv[1], "w"))
PY
  model="$tmp/bert_gpu.json"
  seq=64
fi
flags=(--model bert --bert_config "$model" --deepspeed_config configs/bert_tiny_lamb.json --device "$device"
       --max_seq_length "$seq" --warmup_steps 1 --log_interval 1 --seed 42)
data=(--use_real_data --data "$tmp/train_*.bin")

# 20 steps with validation before and after: the loss is finite and falls.
"$bin" train "${flags[@]}" "${data[@]}" --eval_data "$tmp/val_000.bin" --eval_steps 4 --num_steps 20 \
  --loss_log_file "$tmp/long.csv" --metrics_file "$tmp/long.jsonl" >"$tmp/long.txt" 2>&1 \
  || { cat "$tmp/long.txt"; fail "20-step BERT run"; }
python3 - "$tmp/long.csv" <<'PY' || { cat "$tmp/long.txt"; fail "BERT's loss is not finite or does not fall"; }
import csv, math, sys
l = [float(r["loss"]) for r in csv.DictReader(open(sys.argv[1]))]
assert len(l) == 20 and all(math.isfinite(x) for x in l), l
first, last = sum(l[:5]) / 5, sum(l[-5:]) / 5
assert last < first - 0.5, (first, last, l)
PY
for want in "BERT (Pre-LN, 2 layers" "masked-LM samples of at most $seq tokens" "Objective: masked LM" \
            "Eval before training: val_loss=" "Eval after step 19: val_loss=" "samples/s=" "  Samples/s: " \
            "FINAL RESULTS" "Peak memory: "; do
  grep -qF "$want" "$tmp/long.txt" || { cat "$tmp/long.txt"; fail "the run's output lacks '$want'"; }
done
grep -q '"samples_per_s"' "$tmp/long.jsonl" || fail "metrics file: samples_per_s"
python3 - "$tmp/long.txt" <<'PY' || { cat "$tmp/long.txt"; fail "validation loss does not fall"; }
import re, sys
v = [float(x) for x in re.findall(r"Eval [^\n]*: val_loss=([0-9.]+)", open(sys.argv[1]).read())]
assert len(v) == 2 and v[1] < v[0], v
PY

# Saved at steps 3 and 6; step 3's save resumed to 6: the same losses (data, masks and dropout are
# functions of the seed and the step).
"$bin" train "${flags[@]}" "${data[@]}" --num_steps 6 --loss_log_file "$tmp/ref.csv" >"$tmp/ref.txt" 2>&1 \
  || { cat "$tmp/ref.txt"; fail "uninterrupted run"; }
"$bin" train "${flags[@]}" "${data[@]}" --num_steps 6 --save "$tmp/ck" --save_interval 3 --loss_log_file "$tmp/saved.csv" \
  >"$tmp/s.txt" 2>&1 || { cat "$tmp/s.txt"; fail "run with --save"; }
cmp -s "$tmp/ref.csv" "$tmp/saved.csv" || { paste -d' ' "$tmp/ref.csv" "$tmp/saved.csv"; fail "saving changed the losses"; }
grep -q '"architecture": "BERT"' "$tmp/ck/global_step3/config.json" || { cat "$tmp/ck/global_step3/config.json"; fail "config.json: architecture"; }
"$bin" train "${flags[@]}" "${data[@]}" --num_steps 3 --resume "$tmp/ck/global_step3" --loss_log_file "$tmp/res.csv" \
  >"$tmp/r.txt" 2>&1 || { cat "$tmp/r.txt"; fail "resume"; }
grep -q "Resumed from $tmp/ck/global_step3 at step 3$" "$tmp/r.txt" || { cat "$tmp/r.txt"; fail "resumed line"; }
diff <(awk -F, 'NR > 1 && $1 >= 3' "$tmp/ref.csv") <(tail -n +2 "$tmp/res.csv") >/dev/null \
  || { paste -d' ' "$tmp/ref.csv" "$tmp/res.csv"; fail "resumed losses differ from the uninterrupted run"; }

# Synthetic batches (no --use_real_data) train too.
"$bin" train "${flags[@]}" --num_steps 3 --loss_log_file "$tmp/syn.csv" >"$tmp/syn.txt" 2>&1 \
  || { cat "$tmp/syn.txt"; fail "synthetic run"; }
grep -q "Synthetic masked-LM samples: random real tokens, lengths uniform in \[$((seq / 2)), $seq\]" "$tmp/syn.txt" \
  || { cat "$tmp/syn.txt"; fail "synthetic line"; }

# bing_bert's format (a bert_model_config object) loads, its own keys noted as not acted on.
python3 - "$tmp" "$device" <<'PY'
import json, sys
d, dev = sys.argv[1], sys.argv[2]
hidden, heads = (128, 2) if dev == "cuda" else (64, 4)
m = {"vocab_size_or_config_json_file": 30528, "hidden_size": hidden, "num_hidden_layers": 2, "num_attention_heads": heads,
     "intermediate_size": 4 * hidden, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
     "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 64, "type_vocab_size": 2, "initializer_range": 0.02}
json.dump({"name": "tiny", "bert_model_config": m, "mixed_precision": {"type": "fp16"}}, open(d + "/bing.json", "w"))
m["max_position_embeddings"] = 16
json.dump({"bert_model_config": m}, open(d + "/short.json", "w"))
c = json.load(open("configs/bert_tiny.json")); c["fp16"] = True; json.dump(c, open(d + "/fp16_model.json", "w"))
c = json.load(open("configs/bert_tiny.json")); c["head"] = 4; json.dump(c, open(d + "/typo.json", "w"))
c = json.load(open("configs/bert_tiny.json")); c["heads"] = 5; json.dump(c, open(d + "/heads.json", "w"))
c = json.load(open("configs/bert_tiny.json")); c["batch_size"] = 8; json.dump(c, open(d + "/batch.json", "w"))
c = json.load(open("configs/bert_tiny_lamb.json")); del c["bf16"]; c["fp16"] = {"enabled": True, "loss_scale": 0}
json.dump(c, open(d + "/fp16_ds.json", "w"))
PY
bing_flags=(--model bert --bert_config "$tmp/bing.json" --deepspeed_config configs/bert_tiny_lamb.json --device "$device"
            --max_seq_length "$seq" --num_steps 2 --warmup_steps 1)
"$bin" train "${bing_flags[@]}" >"$tmp/b.txt" 2>&1 || { cat "$tmp/b.txt"; fail "bing_bert format run"; }
grep -q "note: $tmp/bing.json: mixed_precision: read but not acted on" "$tmp/b.txt" || { cat "$tmp/b.txt"; fail "mixed_precision note"; }
grep -q "note: $tmp/bing.json: bert_model_config.type_vocab_size: read but not acted on" "$tmp/b.txt" || { cat "$tmp/b.txt"; fail "type_vocab_size note"; }

# Padding to the longest sequence (issue #20, --pad_to_longest 16): each step's micro-batches cut
# to their longest sample rounded up to 16 (at least the head's slots, at most S): the lengths in
# the metrics and the Step lines, finite losses, and a resumed run's losses equal the straight one's.
"$bin" train "${flags[@]}" "${data[@]}" --pad_to_longest 16 --num_steps 6 --loss_log_file "$tmp/pad.csv" \
  --metrics_file "$tmp/pad.jsonl" >"$tmp/pad.txt" 2>&1 || { cat "$tmp/pad.txt"; fail "--pad_to_longest run"; }
grep -q "samples/s=[0-9.]*, padded to [0-9]* of $seq$" "$tmp/pad.txt" || { cat "$tmp/pad.txt"; fail "padded Step line"; }
python3 - "$tmp/pad.jsonl" "$seq" <<'PY' || { cat "$tmp/pad.jsonl"; fail "padded lengths"; }
import json, math, sys
S = int(sys.argv[2])
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 6, rows
for r in rows:
    L = r["padded_seqlen"]
    assert math.isfinite(r["loss"]) and 0 < L <= S and (L % 16 == 0 or L == S), r
PY
"$bin" train "${flags[@]}" "${data[@]}" --pad_to_longest 16 --num_steps 3 --save "$tmp/ckp" >"$tmp/p1.txt" 2>&1 \
  || { cat "$tmp/p1.txt"; fail "--pad_to_longest first half"; }
"$bin" train "${flags[@]}" "${data[@]}" --pad_to_longest 16 --num_steps 3 --resume "$tmp/ckp" --loss_log_file "$tmp/pad_r.csv" \
  >"$tmp/p2.txt" 2>&1 || { cat "$tmp/p2.txt"; fail "--pad_to_longest resumed half"; }
diff <(awk -F, 'NR > 1 && $1 >= 3' "$tmp/pad.csv") <(tail -n +2 "$tmp/pad_r.csv") >/dev/null \
  || { paste -d' ' "$tmp/pad.csv" "$tmp/pad_r.csv"; fail "--pad_to_longest: resumed losses differ"; }
echo "ok: --pad_to_longest"

# Errors, each named. expect_error WHAT TEXT ARGS...: the run fails and its output holds TEXT.
expect_error() {
  local what=$1 text=$2
  shift 2
  if "$bin" train "$@" >"$tmp/e.txt" 2>&1; then cat "$tmp/e.txt"; fail "$what accepted"; fi
  grep -qF -- "$text" "$tmp/e.txt" || { cat "$tmp/e.txt"; fail "$what: the message lacks '$text'"; }
}
base=(--model bert --deepspeed_config configs/bert_tiny_lamb.json --device "$device" --num_steps 1)
# fp16: true in the model config selects fp16 training, against the DeepSpeed config's bf16; fp16 on
# the CPU backend (which computes in fp32) is refused (fp16 training on the GPU: bert_fp16_cli.sh).
expect_error "fp16: true in the model config with bf16.enabled" \
  "says fp16: true and configs/bert_tiny_lamb.json says bf16.enabled: true" "${base[@]}" --bert_config "$tmp/fp16_model.json"
if [ "$device" = cpu ]; then
  expect_error "fp16.enabled on the CPU backend" "fp16.enabled: true with --device cpu: the CPU backend computes in fp32" \
    --model bert --bert_config "$model" --deepspeed_config "$tmp/fp16_ds.json" --device cpu --num_steps 1
fi
expect_error "an unknown key" "$tmp/typo.json: head: unknown key 'head' (nearest known key: 'heads')" "${base[@]}" --bert_config "$tmp/typo.json"
expect_error "heads not dividing hidden" "$tmp/heads.json: heads: expected a divisor of hidden_size" "${base[@]}" --bert_config "$tmp/heads.json"
expect_error "batch_size against the micro-batch" "$tmp/batch.json: batch_size: expected the run's micro-batch 4 (train_micro_batch_size_per_gpu of configs/bert_tiny_lamb.json), found 8" \
  "${base[@]}" --bert_config "$tmp/batch.json"
expect_error "a sequence past the position table" "bert_model_config.max_position_embeddings: expected at least the sequence length 32 (--max_seq_length), found 16" \
  "${base[@]}" --bert_config "$tmp/short.json" --max_seq_length 32
expect_error "--model bert without --bert_config" "--model bert needs --bert_config FILE" "${base[@]}"
expect_error "--bert_config without --model bert" "--bert_config is a flag of BERT pre-training: expected --model bert" \
  --deepspeed_config configs/bert_tiny_lamb.json --device "$device" --num_steps 1 --bert_config "$model"
expect_error "a shape flag against the file" "--hidden_dim 32 contradicts --bert_config" "${base[@]}" --bert_config "$model" --hidden_dim 32
expect_error "--pad_to_longest without --model bert" "--pad_to_longest 64 pads BERT's masked-LM micro-batches: expected --model bert" \
  --deepspeed_config configs/bert_tiny_lamb.json --device "$device" --num_steps 1 --pad_to_longest 64
echo "ok: BERT trains (loss and validation fall), resumes equal, trains on synthetic batches, reads bing_bert's file, refuses bad configs by name"
