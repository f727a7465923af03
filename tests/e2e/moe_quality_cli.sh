#!/usr/bin/env bash
# End to end, scripts/moe_quality.py on the tiny shape: WikiText-2 shards prepared, dense, MoE and
# PR-MoE trained with validation and metrics, the table (a row per variant with parameters, losses,
# step time and dropped routes) and the three verdicts, and input errors before any work.
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
echo "ok: three variants, table and verdicts ($device)"

expect_err() { # expect_err TEXT ARGS...
  local want=$1; shift
  if python3 scripts/moe_quality.py --bin "$bin" --device "$device" --out "$tmp/e" "$@" >"$tmp/e.txt" 2>&1; then fail "accepted: $*"; fi
  grep -qF -- "$want" "$tmp/e.txt" || { cat "$tmp/e.txt"; fail "expected '$want' for: $*"; }
}
expect_err "--steps / --warmup: expected steps >= 2 and 0 <= warmup < steps, found 5 / 5" --steps 5 --warmup 5
expect_err "--experts: expected at least 2, found 1" --experts 1
expect_err "--pyramid: expected 2 counts (one per MoE block: every other of 4), found '4,4,8'" --shape tiny --pyramid 4,4,8 --data "$data"
expect_err "--data: expected wikitext-2/valid.txt under '$tmp'" --data "$tmp"
[ ! -e "$tmp/e/data" ] || fail "an input error left work behind"
echo "ok: input errors"
