#!/usr/bin/env bash
# The quality run of the BF16 master-weight layouts: every layout (baseline = fp32 master,
# bf16_master_wg, bf16_full, bf16_full + bf16.bf16_master_compensation, bf16_full +
# bf16.stochastic_rounding) trained on the same WikiText-2 shards, with the same seed, the same
# data order and the same warm-up + cosine LR schedule, with validation; then the loss table
# (final and mean validation loss, mean training loss, each against baseline in %) and an SVG of
# the curves beside DeepSpeed's published 7B curves (scripts/quality_report.py).
#
#   scripts/quality-run.sh [--bin BIN] [--device cuda|cpu] [--models LIST] [--layouts LIST]
#       [--steps N] [--warmup N] [--lr LR] [--eval_interval N] [--eval_steps N] [--seed N]
#       [--budget SECONDS] [--data DIR] [--text_bytes N] [--deepspeed_logs DIR] [--bench_json FILE]
#       [--out DIR]
#
# Models (--models, comma-separated, default bf16_example,gpt2_small):
#   bf16_example  the BF16 example's model: h 1024, 12 layers, 16 heads, batch 4 x seq 512
#   gpt2_small    GPT-2 small's shape: h 768, 12 layers, 12 heads, at batch 4 x seq 512 (seq 1024
#                 x batch 16 takes 34 ms a step: 5 layouts x 1000 steps would not fit the budget)
#   tiny          h 128, 1 layer, 2 heads, batch 2 x seq 16 (the end-to-end test)
# Every model reads the GPT-2 tokenizer's vocabulary (50257, padded to 50304), next-token labels,
# causal attention. --budget: a run is started only when the time its model's previous run took
# (or, for the first, an estimate of 12 ms a step + 15 s) still fits; the others are listed as
# skipped in the table. --data: the folder with wikitext-2/{valid,test}.txt and
# gpt2/{encoder.json,vocab.bpe} (default $CUTRAIN_DATA_DIR, ../shared/data, then .devdata);
# WikiText-2's train split is not there, so valid + test are the corpus, 10% of it held out.
# --text_bytes N: the first N bytes of each file only (quick runs). --bench_json: bench_k3's JSON
# with the adamw/*_comp rows, whose cost against the plain bf16 master joins the report.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bin=build/release/tools/cutrain; device=cuda; models=bf16_example,gpt2_small
layouts=baseline,bf16_master_wg,bf16_full,bf16_full_comp,bf16_full_sr
steps=1000; warmup=100; lr=3e-4; eval_interval=100; eval_steps=20; seed=42; budget=0; text_bytes=0
data=""; ds_logs=""; bench_json=""; out=${OUT:-$root/build/quality}
while (($#)); do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --layouts) layouts=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --eval_interval) eval_interval=$2; shift 2 ;;
    --eval_steps) eval_steps=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --text_bytes) text_bytes=$2; shift 2 ;;
    --deepspeed_logs) ds_logs=$2; shift 2 ;;
    --bench_json) bench_json=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "quality-run: unknown option '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
die() { echo "quality-run: $*" >&2; exit 2; }
int() { [[ $2 =~ ^[0-9]+$ ]] || die "$1: expected a non-negative integer, found '$2'"; }
for v in steps warmup eval_interval eval_steps seed budget text_bytes; do int "--$v" "${!v}"; done
((steps >= 1)) || die "--steps: expected at least 1, found $steps"
((warmup < steps)) || die "--warmup: expected fewer than --steps ($steps), found $warmup"
((eval_interval >= 1 && eval_steps >= 1)) || die "--eval_interval and --eval_steps: expected at least 1"
[[ $lr =~ ^[0-9.]+([eE][-+]?[0-9]+)?$ ]] || die "--lr: expected a positive number, found '$lr'"
case $device in cuda|cpu) ;; *) die "--device: expected cuda or cpu, found '$device'" ;; esac
[ -x "$bin" ] || die "--bin: $bin is not an executable (build first: cmake --build build/release --target cutrain)"

# The model flags and description of each name.
model_flags() {
  case $1 in
    bf16_example) echo "--hidden_dim 1024 --num_layers 12 --num_heads 16 --batch_size 4 --seq_length 512" ;;
    gpt2_small) echo "--hidden_dim 768 --num_layers 12 --num_heads 12 --batch_size 4 --seq_length 512" ;;
    tiny) echo "--hidden_dim 128 --num_layers 1 --num_heads 2 --batch_size 2 --seq_length 16" ;;
    *) return 1 ;;
  esac
}
model_desc() {
  case $1 in
    bf16_example) echo "the BF16 example's model (h 1024, 12 layers, 16 heads), batch 4 x seq 512" ;;
    gpt2_small) echo "GPT-2 small's shape (h 768, 12 layers, 12 heads), batch 4 x seq 512" ;;
    tiny) echo "tiny (h 128, 1 layer, 2 heads), batch 2 x seq 16" ;;
  esac
}
# The layout's DeepSpeed config: the shipped one plus the bf16 option.
layout_base() {
  case $1 in
    baseline) echo baseline ;; bf16_master_wg) echo bf16_master_wg ;;
    bf16_full|bf16_full_comp|bf16_full_sr) echo bf16_full ;;
    *) return 1 ;;
  esac
}
IFS=, read -r -a model_list <<<"$models"
IFS=, read -r -a layout_list <<<"$layouts"
for m in "${model_list[@]}"; do model_flags "$m" >/dev/null || die "--models: unknown model '$m' (bf16_example, gpt2_small, tiny)"; done
for l in "${layout_list[@]}"; do
  layout_base "$l" >/dev/null || die "--layouts: unknown layout '$l' (baseline, bf16_master_wg, bf16_full, bf16_full_comp, bf16_full_sr)"
done

if [ -z "$data" ]; then
  for d in "${CUTRAIN_DATA_DIR:-}" ../shared/data .devdata; do
    [ -n "$d" ] && [ -e "$d/wikitext-2/valid.txt" ] && { data=$d; break; }
  done
fi
for f in wikitext-2/valid.txt wikitext-2/test.txt gpt2/encoder.json gpt2/vocab.bpe; do
  [ -e "$data/$f" ] || die "--data: expected $f under '${data:-(none found)}' (WikiText-2 and the GPT-2 tokenizer files)"
done
if [ -z "$ds_logs" ]; then
  for d in ../shared/peers/deepspeed/examples/training/bf16_master_weight/logs/7b_loss_run .devdata/deepspeed_bf16_logs; do
    [ -e "$d/baseline_loss.csv" ] && { ds_logs=$d; break; }
  done
fi

mkdir -p "$out/data"
t_start=$(date +%s)
# ---- the shards: WikiText-2 valid + test, 10% held out for validation ----
inputs=("$data/wikitext-2/valid.txt" "$data/wikitext-2/test.txt")
if ((text_bytes > 0)); then
  head -c "$text_bytes" "${inputs[0]}" >"$out/data/valid.txt"
  head -c "$text_bytes" "${inputs[1]}" >"$out/data/test.txt"
  inputs=("$out/data/valid.txt" "$out/data/test.txt")
fi
rm -f "$out"/data/wt2_*.bin
"$bin" prepare-data --input "${inputs[@]}" --vocab "$data/gpt2/encoder.json" --merges "$data/gpt2/vocab.bpe" \
    --output "$out/data/wt2" --val_fraction 0.1 >"$out/data/prepare.log" 2>&1 \
  || { cat "$out/data/prepare.log" >&2; die "prepare-data failed (log above)"; }

# ---- one config per layout: the shipped config, the warm-up + cosine schedule, the bf16 option ----
mkdir -p "$out/configs"
for l in "${layout_list[@]}"; do
  python3 - "configs/$(layout_base "$l").json" "$out/configs/$l.json" "$l" "$steps" "$warmup" <<'PY'
import json, os, sys
src, dst, layout, steps, warmup = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
c = json.load(open(src))
c["scheduler"] = {"type": "WarmupCosineLR", "params": {"total_num_steps": steps, "warmup_num_steps": warmup,
                  "warmup_type": "linear", "warmup_min_ratio": 0.0, "cos_min_ratio": 0.1}}
if layout == "bf16_full_comp":
    c["bf16"]["bf16_master_compensation"] = True
# Named in every bf16 layout: bf16 masters round stochastically by default, and the plain
# layouts are measured with round-to-nearest.
if c.get("bf16", {}).get("enabled"):
    c["bf16"]["stochastic_rounding"] = layout == "bf16_full_sr"
with open(dst + ".tmp", "w") as f:
    json.dump(c, f, indent=2)
os.replace(dst + ".tmp", dst)
PY
done

# ---- the runs ----
: >"$out/models.txt"
for m in "${model_list[@]}"; do
  note=""
  # The CPU backend is the fp32 reference: every layout trains the same there (a test of the tool).
  [ "$device" = cpu ] && note=" (cpu: the fp32 reference backend trains every layout alike; this checks the tool, not the layouts)"
  echo "$m|$(model_desc "$m"), WikiText-2 valid+test (10% held out), $steps steps, lr $lr, $warmup warm-up steps + cosine to 0.1, seed $seed, $device$note" >>"$out/models.txt"
  mkdir -p "$out/$m"
  rm -f "$out/$m"/*.log "$out/$m"/*_loss.csv
  last=$((steps * 12 / 1000 + 15))  # seconds: an estimate until this model's first run is timed
  for l in "${layout_list[@]}"; do
    left=$((budget - ($(date +%s) - t_start)))
    if ((budget > 0 && left < last)); then
      echo "quality-run: skipped (budget: ${left} s left, the run takes about ${last} s)" | tee "$out/$m/$l.log"
      continue
    fi
    echo "== $m / $l"
    t0=$(date +%s)
    # shellcheck disable=SC2046
    if ! "$bin" train --deepspeed_config "$out/configs/$l.json" --device "$device" $(model_flags "$m") --pad_vocab \
        --use_real_data --data "$out/data/wt2_train_*.bin" --eval_data "$out/data/wt2_val_*.bin" \
        --num_steps "$steps" --warmup_steps $((steps > 10 ? 10 : 0)) --learning_rate "$lr" --seed "$seed" \
        --eval_interval "$eval_interval" --eval_steps "$eval_steps" --log_interval "$eval_interval" \
        --loss_log_file "$out/$m/${l}_loss.csv" >"$out/$m/$l.log" 2>&1; then
      echo "quality-run: $m / $l failed (tail of $out/$m/$l.log):" >&2
      tail -5 "$out/$m/$l.log" >&2
    fi
    last=$(($(date +%s) - t0 + 2))
    grep -E "^SUMMARY" "$out/$m/$l.log" || true
  done
done

[ -z "$bench_json" ] || [ -e "$bench_json" ] || echo "quality-run: --bench_json $bench_json not found: no cost rows" >&2
[ -e "$bench_json" ] || bench_json=""
python3 scripts/quality_report.py --results "$out" ${ds_logs:+--deepspeed_logs "$ds_logs"} ${bench_json:+--bench "$bench_json"} \
    --md "$out/quality.md" \
    --svg "$out/quality.svg"
echo "quality-run: $(( $(date +%s) - t_start )) s; table $out/quality.md, curves $out/quality.svg"
