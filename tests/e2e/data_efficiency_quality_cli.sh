#!/usr/bin/env bash
# End to end, scripts/data_efficiency_quality.py on the tiny shape: WikiText-2 shards prepared, the
# rarity index built, every variant whose config is in configs/ trained with validation and
# metrics, the table (a row per variant, the times from the metrics' step_time_s and elapsed_s), the
# verdict line, the SVG (a curve per variant and clock, the baseline's best) and the PNG when one
# could be made, the report again from the folder, --variants, --budget, --composed_curriculum
# (the seqlen warm-up composed with random-LTD), --corpus (a folder and a .tar.xz archive of text
# files), and input errors before any work.
#   data_efficiency_quality_cli.sh CUTRAIN_BINARY cpu|cuda   (exits 77 = skipped: no GPU for cuda, or no data)
source "$(dirname "$0")/e2e_lib.sh"
wikitext_data_or_skip
skip_without_gpu

q=(python3 scripts/data_efficiency_quality.py --bin "$bin" --device "$device" --shape tiny --data "$data"
   --text_bytes 40000 --steps 6 --warmup 2 --eval_interval 3 --eval_steps 2)
"${q[@]}" --out "$tmp/q" >"$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt"; fail "data_efficiency_quality"; }
grep -q "^## Data efficiency: validation loss against wall-clock time" "$tmp/out.txt" || fail "no table heading"
grep -Eq "^- Composed reaches the baseline's best validation loss \([0-9.]+\) in <= 80% of its time: .*(met|MISSED)$" \
  "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "no verdict line"; }
python3 - "$tmp/q" "$tmp/out.txt" <<'PY' || { cat "$tmp/out.txt"; fail "results"; }
import json, os, re, sys, xml.dom.minidom
out, text = sys.argv[1], open(sys.argv[2]).read()
meta = json.load(open(os.path.join(out, "meta.json")))
variants = meta["variants"]
want = ["baseline", "curriculum", "random_ltd", "composed"]
if os.path.exists("configs/curriculum_seqlen_gpt.json"):
    want.insert(2, "seqlen")
assert variants == want, (variants, want)
labels = {"baseline": "baseline", "curriculum": "curriculum (vocabularyrarity)", "seqlen": "curriculum (seqlen warm-up)",
          "random_ltd": "random-LTD", "composed": "curriculum + random-LTD"}
res = json.load(open(os.path.join(out, "data_efficiency.json")))
for v in variants:
    row = next((l for l in text.splitlines() if l.startswith(f"| {labels[v]} |")), None)
    assert row, ("no row", v)
    cells = [c.strip() for c in row.strip("|").split("|")]
    r = res[v]
    # final and best from the evaluations, times from the metrics: the sums and the last elapsed_s.
    log = open(os.path.join(out, v + ".log")).read()
    evals = [float(x) for x in re.findall(r"Eval after step \d+: val_loss=([0-9.]+)", log)]
    assert len(evals) == 2 and abs(evals[-1] - r["final"]) < 1e-4 and abs(min(evals) - r["best"]) < 1e-4, (v, evals, r)
    rows = [json.loads(l) for l in open(os.path.join(out, v + "_metrics.jsonl"))]
    assert [x["step"] for x in rows] == list(range(6)), (v, rows)
    ev = [x for x in rows if "val_loss" in x]
    assert [x["step"] for x in ev] == [2, 5] and all(x["eval_time_s"] > 0 for x in ev), (v, ev)
    assert all(b["elapsed_s"] > a["elapsed_s"] for a, b in zip(rows, rows[1:])), v
    assert abs(sum(x["step_time_s"] for x in rows) - r["t_steps"]) < 1e-9 and r["t_wall"] == rows[-1]["elapsed_s"], v
    # the wall clock holds the steps and the evaluations
    assert r["t_wall"] >= r["t_steps"] + sum(x["eval_time_s"] for x in ev) * 0.999, (v, r)
    assert cells[1] == f"{r['final']:.4f}" and cells[3] == f"{r['t_steps']:.1f}", (v, cells)
    pts = r["points"]
    assert [p["step"] for p in pts] == [-1, 2, 5] and pts[0]["t_steps"] == 0, (v, pts)
    # tokens: 6 steps of 2 x 32 (the seqlen warm-up: fewer); layer tokens fewer where blocks drop
    if v == "seqlen":
        assert r["tokens"] < 6 * 64, r
    else:
        assert r["tokens"] == 6 * 64, r
    assert (r["layer_tokens"] < 4 * r["tokens"]) == (v in ("random_ltd", "composed")), (v, r)
base = res["baseline"]
brow = [c.strip() for c in next(l for l in text.splitlines() if l.startswith("| baseline |")).strip("|").split("|")]
assert brow[9] == "1.000", brow  # the baseline reaches its own best at its own time
# configs: the blocks each variant takes, the schedules scaled to the run
cfg = {v: json.load(open(os.path.join(out, "configs", v + ".json"))) for v in variants}
assert "data_efficiency" not in cfg["baseline"]
assert set(cfg["composed"]["data_efficiency"]) >= {"data_sampling", "data_routing"}
assert "data_routing" not in cfg["curriculum"]["data_efficiency"] and "data_sampling" not in cfg["random_ltd"]["data_efficiency"]
m = cfg["composed"]["data_efficiency"]["data_sampling"]["curriculum_learning"]["curriculum_metrics"]["vocabularyrarity"]
assert m["schedule_config"]["total_curriculum_step"] == 2 and os.path.isabs(m["index_to_sample_path"]), m  # round(0.385 * 6)
r = cfg["composed"]["data_efficiency"]["data_routing"]["random_ltd"]
assert r["random_ltd_layer_id"] == [1, 2] and r["random_ltd_schedule"]["min_value"] == 8 and \
    r["random_ltd_schedule"]["max_value"] == 32 and r["random_ltd_schedule"]["schedule_config"]["require_steps"] == 4, r
for v in variants:
    c = cfg[v]
    assert c["scheduler"]["params"]["total_num_steps"] == 6 and c["train_micro_batch_size_per_gpu"] == 2, v
# the SVG: per clock, a curve per variant and the baseline's best (dashed)
svg = xml.dom.minidom.parse(os.path.join(out, "data_efficiency.svg"))
lines = svg.getElementsByTagName("polyline")
assert len(lines) == 2 * (len(variants) + 1), (len(lines), variants)
curves = re.search(r"^Curves: (\S+?\.svg)(?:, (\S+?\.png) \(([^)]+)\))?", text, re.M)
assert curves, "no Curves line"
png = os.path.join(out, "data_efficiency.png")
if curves.group(2):
    assert curves.group(2) == png and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", curves.groups()
else:
    assert not os.path.exists(png) and "no PNG" in text, text[-400:]
PY
echo "ok: variants, table, verdict and curves ($device)"

# The report alone, from the results folder (what the lead runs on fetched logs).
cp "$tmp/q/data_efficiency.md" "$tmp/first.md"
python3 scripts/data_efficiency_quality.py --report "$tmp/q" >/dev/null || fail "report from the folder"
cmp -s "$tmp/first.md" "$tmp/q/data_efficiency.md" || fail "the report differs when re-made"

# --variants and --budget: the baseline runs (no estimate yet), the composed run does not fit in 1 s.
"${q[@]}" --variants composed,baseline --budget 1 --out "$tmp/b" >"$tmp/b.txt" 2>&1 || { cat "$tmp/b.txt"; fail "budget run"; }
grep -q "^| curriculum + random-LTD | skipped (budget" "$tmp/b/data_efficiency.md" || { cat "$tmp/b.txt"; fail "no skipped row"; }
grep -q "^- Composed reaches .*: n/a (composed skipped (budget" "$tmp/b/data_efficiency.md" || { cat "$tmp/b.txt"; fail "no n/a verdict"; }
[ "$(grep -c '^| ' "$tmp/b/data_efficiency.md")" = 3 ] || { cat "$tmp/b.txt"; fail "rows of --variants composed,baseline"; }
echo "ok: --variants, --budget"

# --composed_curriculum seqlen / both: the composed run's config takes the seqlen warm-up (scaled as
# the seqlen variant's) beside random-LTD; each step keeps min(kept, its length) tokens.
if [ -e configs/curriculum_seqlen_gpt.json ]; then
  for cc in seqlen both; do
    "${q[@]}" --variants composed --composed_curriculum $cc --out "$tmp/cc_$cc" >"$tmp/cc.txt" 2>&1 \
      || { cat "$tmp/cc.txt"; fail "--composed_curriculum $cc"; }
    python3 - "$tmp/cc_$cc" "$cc" <<'PY' || { cat "$tmp/cc.txt"; fail "--composed_curriculum $cc results"; }
import json, os, sys
out, cc = sys.argv[1], sys.argv[2]
c = json.load(open(os.path.join(out, "configs", "composed.json")))["data_efficiency"]
metrics = c["data_sampling"]["curriculum_learning"]["curriculum_metrics"]
assert set(metrics) == ({"seqlen_truncate"} if cc == "seqlen" else {"seqlen_truncate", "vocabularyrarity"}), metrics
m = metrics["seqlen_truncate"]
assert m["min_difficulty"] == 8 and m["max_difficulty"] == 32 and m["schedule_config"]["total_curriculum_step"] == 2, m
assert c["data_routing"]["random_ltd"]["random_ltd_schedule"]["min_value"] == 8, c
rows = [json.loads(l) for l in open(os.path.join(out, "composed_metrics.jsonl"))]
assert len(rows) == 6 and all(r["random_ltd_kept"] <= r["curriculum_seqlen"] for r in rows), rows
assert any(r["random_ltd_kept"] < r["curriculum_seqlen"] < 32 for r in rows), rows  # drops at a short length
assert all(r["layer_tokens"] == r["curriculum_rows"] * (2 * r["random_ltd_kept"] + 2 * r["curriculum_seqlen"])
           for r in rows), rows
label = "seqlen warm-up + random-LTD" if cc == "seqlen" else "curriculum + seqlen warm-up + random-LTD"
assert any(l.startswith(f"| {label} |") for l in open(os.path.join(out, "data_efficiency.md"))), label
PY
  done
  echo "ok: --composed_curriculum seqlen, both"
fi

# --corpus: a folder of text files and the same files as a .tar.xz archive give the same shards.
mkdir -p "$tmp/corpus"
python3 - "$data/wikitext-2/test.txt" "$tmp/corpus" <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()[:60000]
for i in range(6):
    open(f"{sys.argv[2]}/doc{i}.txt", "w", encoding="utf-8").write(text[i * 10000:(i + 1) * 10000])
PY
tar -C "$tmp/corpus" -cJf "$tmp/corpus.tar.xz" .
for c in "$tmp/corpus" "$tmp/corpus.tar.xz"; do
  n=$(basename "$c")
  python3 scripts/data_efficiency_quality.py --bin "$bin" --device "$device" --shape tiny --corpus "$c" --data "$data" \
    --variants baseline --steps 2 --warmup 1 --eval_interval 2 --eval_steps 1 --out "$tmp/c_$n" >"$tmp/c.txt" 2>&1 \
    || { cat "$tmp/c.txt"; fail "--corpus $n"; }
  grep -q "; --corpus $n (6 files), 10% of its documents held out: " "$tmp/c_$n/data_efficiency.md" || { cat "$tmp/c.txt"; fail "corpus line"; }
done
cmp -s "$tmp/c_corpus/data/de_train_000000.bin" "$tmp/c_corpus.tar.xz/data/de_train_000000.bin" || fail "archive != folder"
echo "ok: --corpus"

# Input errors name the flag and what was expected, before any work.
expect_err() { # expect_err TEXT ARGS...
  local want=$1; shift
  if python3 scripts/data_efficiency_quality.py --bin "$bin" --device "$device" --out "$tmp/e" "$@" >"$tmp/e.txt" 2>&1; then
    fail "accepted: $*"
  fi
  grep -qF -- "$want" "$tmp/e.txt" || { cat "$tmp/e.txt"; fail "expected '$want' for: $*"; }
}
expect_err "--variants: unknown variant 'dropout'" --variants baseline,dropout
expect_err "--variants: a variant named twice" --variants baseline,baseline
expect_err "--steps / --warmup: expected steps >= 2 and 1 <= warmup < steps (WarmupCosineLR's warm-up), found 5 / 5" --steps 5 --warmup 5
expect_err "--ltd_fraction: expected a fraction in (0, 1], found 1.5" --ltd_fraction 1.5
expect_err "--shape: expected one of gpt2_small, bf16_example, tiny, found 'huge'" --shape huge
expect_err "--ltd_min: expected random-LTD's first kept count in [1, 32] (the sequence of --shape tiny), found 64" \
  --shape tiny --ltd_min 64 --data "$data"
expect_err "--corpus: '$tmp/none' does not exist" --corpus "$tmp/none"
expect_err "--data: expected gpt2/encoder.json" --data "$tmp"
expect_err "--report: expected a results folder with meta.json" --report "$tmp"
expect_err "--composed_curriculum: expected vocabularyrarity, seqlen or both, found 'length'" --composed_curriculum length
if [ ! -e configs/curriculum_seqlen_gpt.json ]; then
  expect_err "--variants: 'seqlen' needs configs/curriculum_seqlen_gpt.json" --variants seqlen
fi
[ ! -e "$tmp/e" ] || fail "an input error left work behind"
echo "ok: input errors"
