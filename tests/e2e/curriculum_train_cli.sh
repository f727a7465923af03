#!/usr/bin/env bash
# End to end, CPU only: the vocabularyrarity curriculum in `cutrain train --use_real_data` on a
# small shard written here, its index from `cutrain analyze-data`: the curriculum line and the
# per-interval difficulty / eligible-count lines, curriculum_difficulty in the metrics, the batches
# differ from the plain sampler's, a resumed run's losses equal the straight run's, and the errors
# (an index of another shard, of another sequence length, an empty eligible set, a missing index).
#   curriculum_train_cli.sh CUTRAIN_BINARY cpu|cuda   (the cuda variant exits 77: covered on the CPU)
source "$(dirname "$0")/e2e_lib.sh"
[ "$device" = cpu ] || { echo "the curriculum's draw is host code: covered by the cpu variant"; exit 77; }

python3 - "$tmp" <<'PY'
import random, struct, sys
for name, n, seed in (("train", 3001, 5), ("other", 3001, 6)):
    rng = random.Random(seed)
    toks = [min(rng.randrange(3000), rng.randrange(3000)) for _ in range(n)]
    with open(f"{sys.argv[1]}/{name}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *toks))
PY
"$bin" analyze-data --data "$tmp/train.bin" --seq_length 16 --metric vocabularyrarity --output "$tmp/idx.json" >/dev/null
"$bin" analyze-data --data "$tmp/other.bin" --seq_length 16 --metric vocabularyrarity --output "$tmp/other_idx.json" >/dev/null
"$bin" analyze-data --data "$tmp/train.bin" --seq_length 8 --metric vocabularyrarity --output "$tmp/seq8_idx.json" >/dev/null

# make_config OUT INDEX TYPE MIN MAX: bf16_master_wg.json with a fixed_linear curriculum over 6 steps.
make_config() {
  python3 - "$@" <<'PY'
import json, sys
out, index, kind, lo, hi = sys.argv[1:]
c = json.load(open("configs/bf16_master_wg.json"))
c["data_efficiency"] = {"enabled": True, "seed": 7, "data_sampling": {"enabled": True, "curriculum_learning": {
    "enabled": True, "curriculum_metrics": {"vocabularyrarity": {
        "index_to_sample_path": index, "difficulty_type": kind, "min_difficulty": int(lo), "max_difficulty": int(hi),
        "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 1}}}}}}
json.dump(c, open(out, "w"))
PY
}
make_config "$tmp/cur.json" idx.json percentile 10 100
run() { "$bin" train --device cpu --use_real_data --data "$tmp/train.bin" --hidden_dim 32 --num_heads 2 --num_layers 1 \
          --seq_length 16 --batch_size 2 --learning_rate 1e-2 --log_interval 2 --seed 3 "$@"; }

run --deepspeed_config "$tmp/cur.json" --num_steps 6 --metrics_file "$tmp/m.jsonl" --loss_log_file "$tmp/straight.csv" \
  >"$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt"; fail "curriculum run"; }
grep -q "curriculum: vocabularyrarity from $tmp/idx.json (187 samples, difficulty percentile 10 -> 100, fixed_linear, seed 7)" \
  "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "curriculum line"; }
grep -q "read but not acted on.*data_efficiency.enabled\|data_efficiency.enabled.*read but not acted on" "$tmp/out.txt" \
  && fail "data_efficiency.enabled still warned"
python3 - "$tmp/out.txt" "$tmp/m.jsonl" <<'PY' || { cat "$tmp/out.txt"; fail "difficulty lines / metrics"; }
import json, re, sys
lines = re.findall(r"Step (\d+): curriculum difficulty=(\d+) \(percentile\), eligible samples=(\d+) of 187", open(sys.argv[1]).read())
assert [int(s) for s, _, _ in lines] == [0, 2, 4, 5], lines
# fixed_linear over 6 steps from 10 to 100 at the 1-based step: floor((s+1)/6*90+10)
for s, d, n in lines:
    s, d, n = int(s), int(d), int(n)
    assert d == min(100, int((s + 1) / 6 * 90 + 10)), (s, d)
    assert n == 187 * d // 100 - 187 * 10 // 100, (s, d, n)
rows = [json.loads(l) for l in open(sys.argv[2])]
assert [r["curriculum_difficulty"] for r in rows] == [min(100, int((s + 1) / 6 * 90 + 10)) for s in range(6)], rows
PY
echo "ok: curriculum lines and metrics"

# The curriculum changes the batches: the plain sampler's losses differ.
run --deepspeed_config configs/bf16_master_wg.json --num_steps 6 --loss_log_file "$tmp/plain.csv" >"$tmp/p.txt" 2>&1 \
  || { cat "$tmp/p.txt"; fail "plain run"; }
[ "$(tail -n 5 "$tmp/plain.csv")" != "$(tail -n 5 "$tmp/straight.csv")" ] || fail "the curriculum drew the plain sampler's batches"

# Resume: 3 steps + save, then 3 from the checkpoint, give the straight run's losses.
run --deepspeed_config "$tmp/cur.json" --num_steps 3 --save "$tmp/ck" >"$tmp/a.txt" 2>&1 || { cat "$tmp/a.txt"; fail "first half"; }
run --deepspeed_config "$tmp/cur.json" --num_steps 3 --resume "$tmp/ck" --loss_log_file "$tmp/resumed.csv" >"$tmp/b.txt" 2>&1 \
  || { cat "$tmp/b.txt"; fail "resumed half"; }
[ "$(tail -n 3 "$tmp/straight.csv")" = "$(tail -n 3 "$tmp/resumed.csv")" ] \
  || { paste "$tmp/straight.csv" "$tmp/resumed.csv"; fail "resumed losses differ from the straight run's"; }
echo "ok: resumed curriculum run equals the straight run"

make_config "$tmp/bad_other.json" other_idx.json percentile 10 100
expect_config_error "$tmp/other_idx.json" "$tmp/bad_other.json"
make_config "$tmp/bad_seq.json" seq8_idx.json percentile 10 100
expect_config_error "$tmp/seq8_idx.json" "$tmp/bad_seq.json"
make_config "$tmp/bad_missing.json" missing.json percentile 10 100
expect_config_error "index_to_sample_path: expected the index" "$tmp/bad_missing.json"
make_config "$tmp/bad_empty.json" idx.json value 1000 2000
expect_config_error "curriculum: no sample is eligible at step 0" "$tmp/bad_empty.json"
if "$bin" train --device cpu --deepspeed_config "$tmp/cur.json" --hidden_dim 32 --num_heads 2 --num_layers 1 \
    --seq_length 16 --batch_size 2 --num_steps 1 >"$tmp/err.txt" 2>&1; then fail "curriculum accepted with random data"; fi
grep -q "expected --use_real_data" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "random-data error"; }
echo "curriculum_train_cli: ok"
