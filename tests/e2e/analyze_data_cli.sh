#!/usr/bin/env bash
# End to end, CPU only: `cutrain analyze-data` on small llm.c shards written here by Python (a
# skewed token distribution, two shards of odd sizes), against the plain-Python reference
# (tests/scripts/curriculum_index_reference.py) for both metrics and both label modes; the same
# index from 1 and 5 threads; no progress bar off a terminal; and the bad-input errors.
#   analyze_data_cli.sh CUTRAIN_BINARY cpu|cuda   (the cuda variant exits 77: the command is CPU only)
source "$(dirname "$0")/e2e_lib.sh"
[ "$device" = cpu ] || { echo "analyze-data runs on the CPU: covered by the cpu variant"; exit 77; }
ref=tests/scripts/curriculum_index_reference.py

python3 - "$tmp" <<'PY'
import random, struct, sys
rng = random.Random(11)
for name, n in (("a", 5032), ("b", 2890)):
    toks = [min(rng.randrange(500), rng.randrange(500), rng.randrange(500)) for _ in range(n)]
    with open(f"{sys.argv[1]}/d_{name}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *toks))
PY
shards=("$tmp/d_a.bin" "$tmp/d_b.bin")

for metric in vocabularyrarity seqlen; do
  for labels in next_token identity; do
    extra=(); [ "$labels" = identity ] && extra=(--identity)
    "$bin" analyze-data --data "$tmp/d_*.bin" --metric "$metric" --seq_length 37 --labels "$labels" --vocab_size 500 \
        --threads 5 --output "$tmp/idx.json" >"$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt"; fail "analyze-data $metric $labels"; }
    python3 "$ref" "$tmp/idx.json" "${shards[@]}" --metric "$metric" --seq_length 37 "${extra[@]}" \
      || fail "index differs from the Python reference ($metric, $labels)"
  done
done
grep -q "^analyze-data: seqlen over 214 samples of 37 tokens in 2 shard(s)" "$tmp/out.txt" || fail "summary line"
# The reference can fail: one metric value moved.
"$bin" analyze-data --data "$tmp/d_*.bin" --seq_length 37 --vocab_size 500 --output "$tmp/idx.json" >/dev/null
python3 - "$tmp/idx.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); j["index_to_metric"][3] += 1e-9; json.dump(j, open(sys.argv[1], "w"))
PY
python3 "$ref" "$tmp/idx.json" "${shards[@]}" --metric vocabularyrarity --seq_length 37 >/dev/null && fail "reference missed a changed value"
grep -q "^wrote $tmp/idx.json" "$tmp/out.txt" || fail "wrote line"
grep -q "analyze \[" "$tmp/out.txt" && fail "progress bar written off a terminal"

"$bin" analyze-data --data "$tmp/d_*.bin" --seq_length 16 --vocab_size 500 --threads 1 --output "$tmp/one.json" >/dev/null
"$bin" analyze-data --data "$tmp/d_*.bin" --seq_length 16 --vocab_size 500 --threads 5 --output "$tmp/five.json" >/dev/null
cmp -s "$tmp/one.json" "$tmp/five.json" || fail "the index depends on the thread count"
ls -a "$tmp" | grep -q "\.tmp\." && fail "a temporary file was left behind"

# Bad input: each error names what is wrong, and no index is written.
expect_error() {  # expect_error TEXT ARGS...
  local text=$1; shift
  if "$bin" analyze-data "$@" >"$tmp/err.txt" 2>&1; then fail "no error for: $*"; fi
  grep -qF -- "$text" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "error without '$text'"; }
}
expect_error "matches no file" --data "$tmp/none_*.bin" --output "$tmp/x.json"
expect_error "--metric: expected one of \"seqlen\", \"vocabularyrarity\", found \"perplexity\"" \
  --data "$tmp/d_*.bin" --metric perplexity --output "$tmp/x.json"
expect_error "is not a folder" --data "$tmp/d_*.bin" --output "$tmp/missing/x.json"
expect_error "fewer than one window" --data "$tmp/d_*.bin" --seq_length 6000 --output "$tmp/x.json"
printf 'not a shard at all, just some text that is longer than nothing' >"$tmp/bad.bin"
expect_error "$tmp/bad.bin" --data "$tmp/bad.bin" --output "$tmp/x.json"
expect_error "$tmp/d_a.bin" --data "$tmp/d_a.bin" --vocab_size 100 --output "$tmp/x.json"
[ -e "$tmp/x.json" ] && fail "an index was written despite an error"
echo "analyze_data_cli: ok"
