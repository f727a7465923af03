#!/usr/bin/env bash
# End to end, scripts/quality-run.sh on the tiny model: WikiText-2 shards prepared, the five
# layouts trained with validation, the loss table (a row per layout, deltas against baseline, the
# targets' verdicts), the SVG (a curve per layout and panel, DeepSpeed's 7B curves when its logs
# are here), the report again from the results folder, --budget skipping runs, and input errors.
#   quality_run_cli.sh CUTRAIN_BINARY cpu|cuda   (exits 77 = skipped: no GPU for cuda, or no data)
source "$(dirname "$0")/e2e_lib.sh"
wikitext_data_or_skip
skip_without_gpu

# DeepSpeed-style logs of 20 steps: baseline ends at 2.0 (mean 3.0), bf16_full at 2.2 (mean 3.3).
mkdir -p "$tmp/ds"
python3 - "$tmp/ds" <<'PY'
import sys
for name, k in (("baseline", 1.0), ("bf16_full", 1.1)):
    with open(f"{sys.argv[1]}/{name}_loss.csv", "w") as f:
        f.write("step,loss\n" + "".join(f"{i},{k * (4.0 - 2.0 * i / 19)}\n" for i in range(20)))
PY
q=(scripts/quality-run.sh --bin "$bin" --device "$device" --models tiny --data "$data" --text_bytes 40000
   --steps 6 --warmup 2 --eval_interval 3 --eval_steps 2 --deepspeed_logs "$tmp/ds")
"${q[@]}" --out "$tmp/q" >"$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt"; fail "quality-run"; }
grep -q "^## BF16 master weights: loss by layout" "$tmp/out.txt" || fail "no table heading"
for row in "baseline (fp32 master) | 16 |" "bf16_master_wg | 12 |" "bf16_full | 8 |" "bf16_full + compensation | 10 |" \
           "bf16_full + stochastic rounding | 8 |"; do
  grep -qF "| $row" "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "no table row '$row'"; }
done
grep -Eq "^- tiny, bf16_full \+ compensation: final [-+][0-9.]+%, mean [-+][0-9.]+%: (met|MISSED) \(within 0.3%\)" \
  "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "no compensation verdict"; }
[ -s "$tmp/q/quality.md" ] || fail "quality.md not written"
grep -qF "final 2.0000 (baseline) vs 2.2000 (bf16_full), +10.00%; mean 3.0000 vs 3.3000, +10.00%" "$tmp/out.txt" \
  || { cat "$tmp/out.txt"; fail "DeepSpeed's deltas"; }
python3 - "$tmp/q" <<'PY' || fail "results"
import os, re, sys, xml.dom.minidom
out = sys.argv[1]
for l in ("baseline", "bf16_master_wg", "bf16_full", "bf16_full_comp", "bf16_full_sr"):
    log = open(os.path.join(out, "tiny", l + ".log")).read()
    evals = re.findall(r"Eval (?:before training|after step \d+): val_loss=([0-9.]+)", log)
    assert len(evals) == 3, (l, evals)                       # before training, after 3 and 6
    rows = open(os.path.join(out, "tiny", l + "_loss.csv")).read().split()
    assert rows[0] == "step,loss" and len(rows) == 7, (l, rows)
    cfg = open(os.path.join(out, "configs", l + ".json")).read()
    assert '"WarmupCosineLR"' in cfg and ('"bf16_master_compensation": true' in cfg) == (l == "bf16_full_comp"), l
    assert ('"stochastic_rounding": true' in cfg) == (l == "bf16_full_sr"), l
svg = xml.dom.minidom.parse(os.path.join(out, "quality.svg"))
lines = svg.getElementsByTagName("polyline")
# validation and training loss: 5 each; against baseline: 4 and DeepSpeed's delta; DeepSpeed's row:
# 2 curves and its delta.
want = 5 + 5 + 4 + 1 + 3
assert len(lines) == want, (len(lines), want)
PY
echo "ok: five layouts, table and curves ($device)"

# The report alone, from the results folder (what the lead runs on fetched logs).
python3 scripts/quality_report.py --results "$tmp/q" --deepspeed_logs "$tmp/ds" --md "$tmp/again.md" >/dev/null \
  || fail "report from the folder"
cmp -s "$tmp/again.md" "$tmp/q/quality.md" || fail "the report differs when re-made"

# --budget: nothing fits in 1 s (the first run's estimate is 15 s): every run listed as skipped.
"${q[@]}" --layouts baseline,bf16_full_comp --budget 1 --out "$tmp/b" >"$tmp/b.txt" 2>&1 || { cat "$tmp/b.txt"; fail "budget run"; }
[ "$(grep -c "skipped: (budget" "$tmp/b/quality.md")" = 2 ] || { cat "$tmp/b.txt"; fail "budget skips not in the table"; }
echo "ok: --budget skips"

# Input errors name the flag and what was expected, before any work.
expect_err() { # expect_err TEXT ARGS...
  local want=$1; shift
  if scripts/quality-run.sh --bin "$bin" --device "$device" --out "$tmp/e" "$@" >"$tmp/e.txt" 2>&1; then fail "accepted: $*"; fi
  grep -qF -- "$want" "$tmp/e.txt" || { cat "$tmp/e.txt"; fail "expected '$want' for: $*"; }
}
expect_err "--models: unknown model 'gpt3'" --models gpt3
expect_err "--layouts: unknown layout 'bf16_half'" --layouts baseline,bf16_half
expect_err "--steps: expected a non-negative integer, found 'ten'" --steps ten
expect_err "--warmup: expected fewer than --steps (5), found 5" --steps 5 --warmup 5
expect_err "--data: expected wikitext-2/valid.txt under '$tmp'" --data "$tmp"
expect_err "unknown option '--step'" --step 3
[ ! -e "$tmp/e/data" ] || fail "an input error left work behind"
echo "ok: input errors"
