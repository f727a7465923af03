#!/usr/bin/env bash
# End to end, scripts/moe_quality.py on the tiny shape: WikiText-2 shards prepared, dense, MoE and
# PR-MoE trained with validation and metrics, the table (a row per variant with parameters, losses,
# step time and dropped routes) and the three verdicts, top-1 with random token selection; --corpus (a .tar.xz of text files) with
# --top_k 2 and --capacity_factor; and input errors before any work.
#   moe_quality_cli.sh CUTRAIN_BINARY cpu|cuda   (exits 77 = skipped: no GPU for cuda, or no data)
source "$(dirname "$0")/e2e_lib.sh"
wikitext_data_or_skip
skip_without_gpu

q=(python3 scripts/moe_quality.py --bin "$bin" --device "$device" --shape tiny --data "$data" --text_bytes 40000
   --steps 6 --warmup 2 --eval_interval 3 --eval_steps 2)
"${q[@]}" --out "$tmp/q" >"$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt"; fail "moe_quality"; }
for row in "| dense |" "| MoE, 8 experts every other block, top-1 |" "| PR-MoE, experts 4,4, residual MLP, top-1 |"; do
  grep -qF "$row" "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "no table row '$row'"; }
done
for v in "MoE's validation loss below dense's" "PR-MoE within 1% of MoE with fewer parameters" "MoE step <= 1.3x dense"; do
  grep -Eq "^- $v.*: (met|MISSED)$" "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "no verdict '$v'"; }
done
python3 - "$tmp/q" <<'PY' || fail "results"
import json, os, re, sys
out = sys.argv[1]
res = json.load(open(os.path.join(out, "moe_quality.json")))
assert set(res) == {"dense", "moe", "prmoe"}, res.keys()
assert res["dense"]["dropped"] == 0 and res["dense"]["moe_blocks"] == 0
assert res["moe"]["moe_blocks"] == 2 and res["prmoe"]["moe_blocks"] == 2, res
# MoE replaces two FFNs by 8 experts each (+ gate); PR-MoE by 4 experts + the residual MLP + mix.
assert res["prmoe"]["params"] < res["moe"]["params"] and res["dense"]["params"] < res["prmoe"]["params"], res
for name, r in res.items():
    log = open(os.path.join(out, name + ".log")).read()
    evals = re.findall(r"Eval (?:before training|after step \d+): val_loss=([0-9.]+)", log)
    assert len(evals) == 3 and abs(float(evals[-1]) - r["final_val"]) < 1e-4, (name, evals, r)
    rows = [json.loads(l) for l in open(os.path.join(out, name + "_metrics.jsonl"))]
    assert [x["step"] for x in rows] == list(range(6)), (name, rows)
    assert sum(b["dropped"] for x in rows for b in x.get("moe", [])) == r["dropped"], name
PY
grep -qF "MoE top-1 at capacity factor 1, random token selection, $device" "$tmp/out.txt" \
  || { cat "$tmp/out.txt"; fail "no random token selection in the header"; }
grep -q "MoE blocks 1,3: .*top-1, .*token dropping, random token selection" "$tmp/q/moe.log" \
  || { head -40 "$tmp/q/moe.log"; fail "the MoE run does not select tokens at random"; }
echo "ok: three variants, table and verdicts ($device)"

# --corpus, --top_k 2, --capacity_factor 1.25: the corpus in the header, both MoE variants routing
# top-2 at that factor (their start line, every step's capacity: ceil(2 · 64 tokens / E · 1.25)),
# the dropped share over two routes per token.
mkdir -p "$tmp/corpus"
python3 - "$data/wikitext-2/test.txt" "$tmp/corpus" <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()[:60000]
for i in range(6):
    open(f"{sys.argv[2]}/doc{i}.txt", "w", encoding="utf-8").write(text[i * 10000:(i + 1) * 10000])
PY
tar -C "$tmp/corpus" -cJf "$tmp/corpus.tar.xz" .
python3 scripts/moe_quality.py --bin "$bin" --device "$device" --shape tiny --data "$data" --corpus "$tmp/corpus.tar.xz" \
  --steps 4 --warmup 1 --eval_interval 2 --eval_steps 1 --top_k 2 --capacity_factor 1.25 --out "$tmp/c" >"$tmp/c.txt" 2>&1 \
  || { cat "$tmp/c.txt"; fail "moe_quality --corpus"; }
grep -qF "batch 2 x seq 32, --corpus corpus.tar.xz (6 files), 10% of its documents held out: " "$tmp/c.txt" \
  || { cat "$tmp/c.txt"; fail "no corpus in the header"; }
grep -qF "MoE top-2 at capacity factor 1.25, $device" "$tmp/c.txt" || { cat "$tmp/c.txt"; fail "no top-k / factor in the header"; }
for row in "| MoE, 8 experts every other block, top-2 |" "| PR-MoE, experts 4,4, residual MLP, top-2 |"; do
  grep -qF "$row" "$tmp/c.txt" || { cat "$tmp/c.txt"; fail "no table row '$row'"; }
done
grep -q "^- MoE's validation loss below dense's at equal active FLOPs (top-2: twice the FFN FLOPs in MoE blocks): .*: \(met\|MISSED\)$" \
  "$tmp/c.txt" || { cat "$tmp/c.txt"; fail "no top-2 verdict"; }
python3 - "$tmp/c" <<'PY' || fail "corpus results"
import json, os, re, sys
out = sys.argv[1]
res = json.load(open(os.path.join(out, "moe_quality.json")))
table = open(os.path.join(out, "moe_quality.md")).read()
for name, experts in (("moe", 8), ("prmoe", 4)):
    log = open(os.path.join(out, name + ".log")).read()
    assert re.search(r"MoE blocks 1,3: .*top-2, capacity factor 1\.25 \(eval 1\)", log), (name, log[:2000])
    rows = [json.loads(l) for l in open(os.path.join(out, name + "_metrics.jsonl"))]
    caps = {b["capacity"] for x in rows for b in x["moe"]}
    assert caps == {-(-2 * 64 * 5 // (4 * experts))}, (name, caps)  # ceil(2 · 64 / E · 1.25)
    dropped = sum(b["dropped"] for x in rows for b in x["moe"])
    assert dropped == res[name]["dropped"], name
    share = f"{dropped:,} ({100.0 * dropped / (2 * 64 * 2 * 4):.2f}%)"  # 2 routes x 64 tokens x 2 blocks x 4 steps
    assert share in table, (name, share, table)
PY
echo "ok: --corpus, --top_k 2, --capacity_factor ($device)"

expect_err() { # expect_err TEXT ARGS...
  local want=$1; shift
  if python3 scripts/moe_quality.py --bin "$bin" --device "$device" --out "$tmp/e" "$@" >"$tmp/e.txt" 2>&1; then fail "accepted: $*"; fi
  grep -qF -- "$want" "$tmp/e.txt" || { cat "$tmp/e.txt"; fail "expected '$want' for: $*"; }
}
expect_err "--steps / --warmup: expected steps >= 2 and 0 <= warmup < steps, found 5 / 5" --steps 5 --warmup 5
expect_err "--experts: expected at least 2, found 1" --experts 1
expect_err "--top_k: expected 1 or 2, found 3" --top_k 3
expect_err "--capacity_factor: expected a finite number > 0, found 0.0" --capacity_factor 0
expect_err "--corpus: '$tmp/none' does not exist" --corpus "$tmp/none"
expect_err "--use_rts true: random token selection is top-1's, found --top_k 2" --top_k 2 --use_rts true
expect_err "--top_k 2: every MoE block needs at least 2 experts, --pyramid has '1,2'" --shape tiny --top_k 2 --pyramid 1,2 --data "$data"
expect_err "--pyramid: expected 2 counts (one per MoE block: every other of 4), found '4,4,8'" --shape tiny --pyramid 4,4,8 --data "$data"
expect_err "--data: expected wikitext-2/valid.txt under '$tmp'" --data "$tmp"
[ ! -e "$tmp/e/data" ] || fail "an input error left work behind"
echo "ok: input errors"
