#!/usr/bin/env bash
# End to end: the sequence-length curriculum in `cutrain train` (data_efficiency's seqlen_truncate
# and seqlen_reshape, the legacy curriculum_learning block) on a small model: the curriculum line,
# the per-interval seqlen lines, curriculum_seqlen / curriculum_rows / tokens / consumed_tokens in
# the metrics against the pacing and Megatron-DeepSpeed's row counts, tokens_per_s of the real
# tokens, a resumed run's losses and figures equal to the straight run's, --lr_decay_tokens's lr
# against the token-based decay, real data, composed with random-LTD (kept = min(schedule, L),
# layer tokens at the real length, resume), and each bad input named before any step. CPU only:
# ZeRO 2 on 2 host ranks gives the single process's truncate losses, alone and with random-LTD.
#   seqlen_curriculum_cli.sh CUTRAIN_BINARY cpu|cuda
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu
clear_launch_env
if [ "$device" = cuda ]; then
  S=64; size=(--hidden_dim 128 --num_heads 2 --num_layers 2 --vocab_size 1000 --seq_length 64 --batch_size 2)
else
  S=16; size=(--hidden_dim 32 --num_heads 2 --num_layers 2 --vocab_size 64 --seq_length 16 --batch_size 2)
fi
LO=$((S / 4))

# make_config OUT METRIC [KEY=VALUE...]: configs/curriculum_seqlen_gpt.json shrunk to this model (S/4
# -> S over 4 steps in multiples of S/4, WarmupDecayLR 2 + 8 steps) with METRIC (seqlen_truncate,
# seqlen_reshape, or legacy: the top-level block instead); overrides: a key of the metric's block,
# accum=N, both=1 (the other seqlen metric too), legacy_too=1, ltd=1 (random-LTD on),
# sched=WarmupLR.
make_config() {
  python3 - "$S" "$LO" "$@" <<'PY'
import json, sys
S, lo, out, metric, *kv = sys.argv[1:]
S, lo = int(S), int(lo)
c = json.load(open("configs/curriculum_seqlen_gpt.json"))
c["train_micro_batch_size_per_gpu"] = 2
c["scheduler"]["params"].update({"warmup_num_steps": 2, "total_num_steps": 8, "warmup_max_lr": 1e-2})
cl = c["data_efficiency"]["data_sampling"]["curriculum_learning"]
m = cl["curriculum_metrics"].pop("seqlen_truncate")
m.update({"min_difficulty": lo, "max_difficulty": S, "schedule_config": {"total_curriculum_step": 4, "difficulty_step": lo}})
legacy = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": lo, "max_difficulty": S,
          "schedule_type": "fixed_linear", "schedule_config": m["schedule_config"]}
if metric == "legacy":
    c["data_efficiency"]["enabled"] = False
    c["curriculum_learning"] = legacy
    m = legacy
else:
    cl["curriculum_metrics"][metric] = m
for item in kv:
    k, v = item.split("=", 1)
    if k == "accum": c["gradient_accumulation_steps"] = int(v)
    elif k == "both": cl["curriculum_metrics"]["seqlen_reshape" if metric == "seqlen_truncate" else "seqlen_truncate"] = dict(m)
    elif k == "legacy_too": c["curriculum_learning"] = legacy
    elif k == "sched": c["scheduler"] = {"type": v, "params": {"warmup_num_steps": 2, "warmup_max_lr": 1e-2}}
    elif k == "ltd":
        c["data_efficiency"]["data_routing"] = {"enabled": True, "random_ltd": {"enabled": True, "total_layer_num": 2,
            "random_ltd_layer_num": 1, "random_ltd_layer_id": [1], "model_type": "decoder", "random_ltd_schedule": {
            "min_value": lo, "max_value": S, "schedule_type": "fixed_linear",
            "schedule_config": {"require_steps": 4, "seq_per_step": lo}}}}
    else: m[k] = json.loads(v)
json.dump(c, open(out, "w"))
PY
}
run() { "$bin" train --device "$device" "${size[@]}" --attention causal --log_interval 2 --seed 3 "$@"; }

# check_metrics METRICS KIND ACCUM WORLD FIRST: each row's length, rows, tokens and their sum against
# the pacing (fixed_linear over 4 steps at the 1-based step) and Megatron-DeepSpeed's row counts.
check_metrics() {
  python3 - "$S" "$LO" "$@" <<'PY'
import json, math, sys
S, lo, path, kind, accum, world, first = sys.argv[1:]
S, lo, accum, world, first = int(S), int(lo), int(accum), int(world), int(first)
B = 2
def seqlen(s):
    d = math.floor((s + 1) / 4 * (S - lo) + lo)
    return min(d - d % lo, S)
def rows(L):
    if L >= S or kind != "seqlen_reshape": return B
    total = B * ((S + 1) // (L + 1)) + B
    n = min(math.ceil(B * (S + 1) / (L + 1)), total)
    return n - 1 if n > 1 and n % 2 else n
rows_ = [json.loads(l) for l in open(path)]
assert rows_ and [r["step"] for r in rows_] == list(range(first, first + len(rows_))), rows_
consumed = sum(accum * world * rows(seqlen(s)) * seqlen(s) for s in range(first))
for r in rows_:
    s, L = r["step"], seqlen(r["step"])
    assert math.isfinite(r["loss"]), r
    assert r["curriculum_seqlen"] == L and r["curriculum_rows"] == rows(L), (s, r, L, rows(L))
    want = accum * world * rows(L) * L
    assert r["tokens"] == want, (s, r["tokens"], want)
    consumed += want
    assert r["consumed_tokens"] == consumed, (s, r["consumed_tokens"], consumed)
    rank_tokens = want // world
    assert abs(r["tokens_per_s"] * r["step_time_s"] - rank_tokens) <= 1e-6 * rank_tokens + 1e-3, r
PY
}

for kind in seqlen_truncate seqlen_reshape; do
  make_config "$tmp/$kind.json" "$kind"
  run --deepspeed_config "$tmp/$kind.json" --num_steps 6 --metrics_file "$tmp/$kind.jsonl" \
    --loss_log_file "$tmp/$kind.csv" >"$tmp/$kind.txt" 2>&1 || { cat "$tmp/$kind.txt"; fail "$kind run"; }
  grep -qF "curriculum: $kind from data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.$kind, sequence length $LO -> $S of $S (fixed_linear over 4 steps, multiples of $LO)" \
    "$tmp/$kind.txt" || { cat "$tmp/$kind.txt"; fail "$kind: curriculum line"; }
  grep -qF "Step 2: curriculum seqlen=$((3 * LO)) of $S ($kind: " "$tmp/$kind.txt" || { cat "$tmp/$kind.txt"; fail "$kind: step line"; }
  grep -q "$kind is read but not acted on" "$tmp/$kind.txt" && { cat "$tmp/$kind.txt"; fail "$kind still warned"; }
  check_metrics "$tmp/$kind.jsonl" "$kind" 1 1 0 || { cat "$tmp/$kind.jsonl"; fail "$kind metrics"; }
done
# The two metrics train on different batches from step 0 (reshape's rows are other windows).
[ "$(sed -n 2p "$tmp/seqlen_truncate.csv")" != "$(sed -n 2p "$tmp/seqlen_reshape.csv")" ] || fail "truncate == reshape"
echo "ok: truncate and reshape lines, metrics by the pacing and Megatron's row counts"

# The legacy block: a truncate warm-up, the same losses as seqlen_truncate.
make_config "$tmp/legacy.json" legacy
run --deepspeed_config "$tmp/legacy.json" --num_steps 6 --loss_log_file "$tmp/legacy.csv" --metrics_file "$tmp/legacy.jsonl" \
  >"$tmp/l.txt" 2>&1 || { cat "$tmp/l.txt"; fail "legacy run"; }
grep -qF "curriculum: seqlen_truncate from curriculum_learning," "$tmp/l.txt" || { cat "$tmp/l.txt"; fail "legacy line"; }
grep -q "curriculum_learning.* is read but not acted on" "$tmp/l.txt" && { cat "$tmp/l.txt"; fail "legacy keys warned"; }
[ "$(cat "$tmp/legacy.csv")" = "$(cat "$tmp/seqlen_truncate.csv")" ] \
  || { paste "$tmp/legacy.csv" "$tmp/seqlen_truncate.csv"; fail "legacy != seqlen_truncate"; }
check_metrics "$tmp/legacy.jsonl" seqlen_truncate 1 1 0 || fail "legacy metrics"
echo "ok: the legacy curriculum_learning block"

# Accumulation, and resume: 3 steps + save, then 3 from the checkpoint: the same lengths, losses
# and token counts.
make_config "$tmp/acc.json" seqlen_reshape accum=2
run --deepspeed_config "$tmp/acc.json" --num_steps 6 --loss_log_file "$tmp/straight.csv" --metrics_file "$tmp/ms.jsonl" \
  >"$tmp/s.txt" 2>&1 || { cat "$tmp/s.txt"; fail "accumulation run"; }
check_metrics "$tmp/ms.jsonl" seqlen_reshape 2 1 0 || { cat "$tmp/ms.jsonl"; fail "accumulation metrics"; }
run --deepspeed_config "$tmp/acc.json" --num_steps 3 --save "$tmp/ck" >"$tmp/a.txt" 2>&1 || { cat "$tmp/a.txt"; fail "first half"; }
run --deepspeed_config "$tmp/acc.json" --num_steps 3 --resume "$tmp/ck" --loss_log_file "$tmp/resumed.csv" \
  --metrics_file "$tmp/mr.jsonl" >"$tmp/b.txt" 2>&1 || { cat "$tmp/b.txt"; fail "resumed half"; }
[ "$(tail -n 3 "$tmp/straight.csv")" = "$(tail -n 3 "$tmp/resumed.csv")" ] \
  || { paste "$tmp/straight.csv" "$tmp/resumed.csv"; fail "resumed losses differ from the straight run's"; }
check_metrics "$tmp/mr.jsonl" seqlen_reshape 2 1 3 || { cat "$tmp/mr.jsonl"; fail "resumed metrics"; }
echo "ok: accumulation, and a resumed run continues the lengths, losses and consumed tokens"

# --lr_decay_tokens: WarmupDecayLR's decay over the trained tokens (Megatron-DeepSpeed's).
D=$((2 * 6 * S))
run --deepspeed_config "$tmp/seqlen_truncate.json" --num_steps 6 --lr_decay_tokens $D --metrics_file "$tmp/lt.jsonl" \
  >"$tmp/lt.txt" 2>&1 || { cat "$tmp/lt.txt"; fail "--lr_decay_tokens run"; }
python3 - "$tmp/lt.jsonl" "$tmp/seqlen_truncate.jsonl" "$D" <<'PY' || fail "token-based lr"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [json.loads(l) for l in open(sys.argv[2])]
D = int(sys.argv[3])
before = lambda s: sum(r["tokens"] for r in rows if r["step"] < s)
warm = before(3)  # warmup_num_steps 2: the decay starts at the 0-based step 3
for r, p in zip(rows, steps):
    s = r["step"]
    if s <= 2:  # the warm-up by steps, as the step-indexed run
        assert abs(r["lr"] - p["lr"]) <= 1e-9, (r, p)
        continue
    want = 1e-2 * (1 - min(1.0, max(0.0, (before(s) - warm) / max(1, D - warm))))
    assert abs(r["lr"] - want) <= 1e-6 * 1e-2, (s, r["lr"], want)
    assert s == 3 or abs(r["lr"] - p["lr"]) > 1e-9, (s, r["lr"], p["lr"])  # the step-indexed decay differs
PY
echo "ok: --lr_decay_tokens decays by the trained tokens"

# Composed with random-LTD (block 1 of 2, kept LO -> S over 4 steps): each step's kept count is
# min(schedule, L) of its length (none dropped where the schedule reaches L), layer_tokens count
# rows x (kept + L) at the real length; the curriculum's tokens are unchanged; resumed == straight.
# check_ltd METRICS KIND ACCUM WORLD FIRST
check_ltd() {
  python3 - "$S" "$LO" "$@" <<'PY'
import json, math, sys
S, lo, path, kind, accum, world, first = sys.argv[1:]
S, lo, accum, world, first = int(S), int(lo), int(accum), int(world), int(first)
B = 2
def seqlen(s):
    d = math.floor((s + 1) / 4 * (S - lo) + lo)
    return min(d - d % lo, S)
def rows(L):
    if L >= S or kind != "seqlen_reshape": return B
    total = B * ((S + 1) // (L + 1)) + B
    n = min(math.ceil(B * (S + 1) / (L + 1)), total)
    return n - 1 if n > 1 and n % 2 else n
def sched(s):
    v = s * (S - lo) // 4 + lo
    return min(v - v % lo, S)
def layer_tokens(s):
    L = seqlen(s)
    return accum * world * rows(L) * (min(sched(s), L) + L)
rs = [json.loads(l) for l in open(path)]
assert rs and [r["step"] for r in rs] == list(range(first, first + len(rs))), rs
consumed = sum(layer_tokens(s) for s in range(first))
dropped = 0
for r in rs:
    s, L = r["step"], seqlen(r["step"])
    assert math.isfinite(r["loss"]), r
    assert r["curriculum_seqlen"] == L and r["random_ltd_kept"] == min(sched(s), L), (s, r, L, sched(s))
    dropped += r["random_ltd_kept"] < L
    assert r["layer_tokens"] == layer_tokens(s), (s, r["layer_tokens"], layer_tokens(s))
    consumed += layer_tokens(s)
    assert r["consumed_layer_tokens"] == consumed, (s, r["consumed_layer_tokens"], consumed)
assert first > 0 or dropped >= 2, "the run never dropped"
PY
}
for kind in seqlen_truncate seqlen_reshape; do
  make_config "$tmp/ltd_$kind.json" "$kind" ltd=1
  run --deepspeed_config "$tmp/ltd_$kind.json" --num_steps 6 --metrics_file "$tmp/ltd_$kind.jsonl" \
    --loss_log_file "$tmp/ltd_$kind.csv" >"$tmp/ltd.txt" 2>&1 || { cat "$tmp/ltd.txt"; fail "$kind + random-LTD run"; }
  grep -qF "random-LTD: blocks [1] keep $LO..$S of $S tokens" "$tmp/ltd.txt" || { cat "$tmp/ltd.txt"; fail "ltd line"; }
  grep -qF "Step 2: random-LTD kept=$((2 * LO)) of $((3 * LO)) tokens in 1 of 2 blocks" "$tmp/ltd.txt" \
    || { cat "$tmp/ltd.txt"; fail "$kind + random-LTD: the step's kept count of its length"; }
  check_metrics "$tmp/ltd_$kind.jsonl" "$kind" 1 1 0 || { cat "$tmp/ltd_$kind.jsonl"; fail "$kind + random-LTD tokens"; }
  check_ltd "$tmp/ltd_$kind.jsonl" "$kind" 1 1 0 || { cat "$tmp/ltd_$kind.jsonl"; fail "$kind + random-LTD metrics"; }
  [ "$(cat "$tmp/ltd_$kind.csv")" != "$(cat "$tmp/$kind.csv")" ] || fail "$kind: random-LTD changed no loss"
done
make_config "$tmp/ltd_acc.json" seqlen_reshape ltd=1 accum=2
run --deepspeed_config "$tmp/ltd_acc.json" --num_steps 6 --loss_log_file "$tmp/ls.csv" --metrics_file "$tmp/ls.jsonl" \
  >"$tmp/ls.txt" 2>&1 || { cat "$tmp/ls.txt"; fail "composed accumulation run"; }
check_ltd "$tmp/ls.jsonl" seqlen_reshape 2 1 0 || { cat "$tmp/ls.jsonl"; fail "composed accumulation metrics"; }
run --deepspeed_config "$tmp/ltd_acc.json" --num_steps 3 --save "$tmp/lck" >"$tmp/la.txt" 2>&1 || { cat "$tmp/la.txt"; fail "composed first half"; }
run --deepspeed_config "$tmp/ltd_acc.json" --num_steps 3 --resume "$tmp/lck" --loss_log_file "$tmp/lr.csv" \
  --metrics_file "$tmp/lr.jsonl" >"$tmp/lb.txt" 2>&1 || { cat "$tmp/lb.txt"; fail "composed resumed half"; }
[ "$(tail -n 3 "$tmp/ls.csv")" = "$(tail -n 3 "$tmp/lr.csv")" ] \
  || { paste "$tmp/ls.csv" "$tmp/lr.csv"; fail "composed: resumed losses differ from the straight run's"; }
check_ltd "$tmp/lr.jsonl" seqlen_reshape 2 1 3 || { cat "$tmp/lr.jsonl"; fail "composed resumed metrics"; }
"$bin" check-config configs/data_efficiency_composed_gpt.json >"$tmp/cc.txt" 2>&1 \
  || { cat "$tmp/cc.txt"; fail "check-config data_efficiency_composed_gpt.json"; }
echo "ok: composed with random-LTD: kept = min(schedule, L), layer tokens at the real length, resume"

P=data_efficiency.data_sampling.curriculum_learning.curriculum_metrics
make_config "$tmp/e1.json" seqlen_reshape max_difficulty=$((S + LO))
expect_config_error "$P.seqlen_reshape.max_difficulty: expected a sequence length <= --seq_length $S, found $((S + LO))" "$tmp/e1.json"
make_config "$tmp/e2.json" seqlen_truncate both=1
expect_config_error "$P: expected one sequence-length metric, found both seqlen_truncate and seqlen_reshape" "$tmp/e2.json"
make_config "$tmp/e3.json" seqlen_truncate legacy_too=1
expect_config_error "curriculum_learning.enabled: expected false with $P.seqlen_truncate" "$tmp/e3.json"
make_config "$tmp/e4.json" seqlen_truncate min_difficulty=$((LO - 1))
expect_config_error "$P.seqlen_truncate.min_difficulty: expected at least schedule_config.difficulty_step $LO" "$tmp/e4.json"
make_config "$tmp/e6.json" seqlen_pad
expect_config_error "$P.seqlen_pad: expected a metric, one of" "$tmp/e6.json"
make_config "$tmp/e7.json" seqlen_truncate sched=WarmupLR
expect_config_error "--lr_decay_tokens 100: expected a positive token count with scheduler.type WarmupDecayLR or WarmupCosineLR" \
  "$tmp/e7.json" --lr_decay_tokens 100
echo "ok: bad input named before any step"
for c in curriculum_seqlen_gpt curriculum_vocabularyrarity_seqlen; do
  "$bin" check-config configs/$c.json >"$tmp/cc.txt" 2>&1 || { cat "$tmp/cc.txt"; fail "check-config $c.json"; }
done

# Real data: next-token windows of a shard written here, truncated and reshaped.
python3 - "$tmp" <<'PY'
import random, struct, sys
rng = random.Random(5)
n = 4001
toks = [min(rng.randrange(3000), rng.randrange(3000)) for _ in range(n)]
with open(f"{sys.argv[1]}/train.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *toks))
PY
for kind in seqlen_truncate seqlen_reshape; do
  run --deepspeed_config "$tmp/$kind.json" --use_real_data --data "$tmp/train.bin" --num_steps 5 \
    --metrics_file "$tmp/real_$kind.jsonl" >"$tmp/real.txt" 2>&1 || { cat "$tmp/real.txt"; fail "real data $kind"; }
  check_metrics "$tmp/real_$kind.jsonl" "$kind" 1 1 0 || fail "real data $kind metrics"
done
# Composed with the vocabularyrarity curriculum (Megatron-DeepSpeed's "vocab rarity + seqlen
# reshape" recipe): the index's draw picks the samples, the seqlen metric rebuilds them.
"$bin" analyze-data --data "$tmp/train.bin" --seq_length "$S" --metric vocabularyrarity --output "$tmp/idx.json" >/dev/null
python3 - "$tmp/seqlen_reshape.json" "$tmp/both.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["data_efficiency"]["data_sampling"]["curriculum_learning"]["curriculum_metrics"]["vocabularyrarity"] = {
    "index_to_sample_path": "idx.json", "difficulty_type": "percentile", "min_difficulty": 10, "max_difficulty": 100,
    "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 1}}
json.dump(c, open(sys.argv[2], "w"))
PY
run --deepspeed_config "$tmp/both.json" --use_real_data --data "$tmp/train.bin" --num_steps 5 \
  --metrics_file "$tmp/both.jsonl" >"$tmp/both.txt" 2>&1 || { cat "$tmp/both.txt"; fail "vocabularyrarity + seqlen_reshape"; }
grep -q "curriculum: vocabularyrarity from" "$tmp/both.txt" || { cat "$tmp/both.txt"; fail "composed: rarity line"; }
grep -q "curriculum: seqlen_reshape from" "$tmp/both.txt" || { cat "$tmp/both.txt"; fail "composed: seqlen line"; }
check_metrics "$tmp/both.jsonl" seqlen_reshape 1 1 0 || fail "composed metrics"
python3 - "$tmp/both.jsonl" <<'PY' || fail "composed: curriculum_difficulty"
import json, sys
assert all("curriculum_difficulty" in json.loads(l) for l in open(sys.argv[1]))
PY
echo "ok: real data, and composed with the vocabularyrarity curriculum"

[ "$device" = cpu ] || exit 0
# ZeRO 2 on 2 host ranks (micro-batch 1 each, global batch 2): the single process's truncate losses
# (truncate rebuilds each sample on its own), the tokens counted over both ranks.
python3 - "$tmp/seqlen_truncate.json" "$tmp/z.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"] = {"stage": 2}
c["train_micro_batch_size_per_gpu"] = 1
c["train_batch_size"] = 2
c.pop("gradient_accumulation_steps", None)
json.dump(c, open(sys.argv[2], "w"))
PY
port=$(free_port)
"$bin" launch --backend host --num_procs 2 --master_port $port -- "$bin" train --device cpu "${size[@]:0:10}" --batch_size 1 \
  --attention causal --log_interval 2 --deepspeed_config "$tmp/z.json" --seed 3 --num_steps 6 --loss_log_file "$tmp/z.csv" \
  --metrics_file "$tmp/z.jsonl" >"$tmp/z.txt" 2>&1 || { cat "$tmp/z.txt"; fail "ZeRO 2 on 2 ranks"; }
same_losses "$tmp/seqlen_truncate.csv" "$tmp/z.csv" "ZeRO 2 on 2 ranks"
python3 - "$tmp/z.jsonl" "$tmp/seqlen_truncate.jsonl" <<'PY' || fail "ZeRO 2 metrics"
import json, sys
z = [json.loads(l) for l in open(sys.argv[1])]
one = [json.loads(l) for l in open(sys.argv[2])]
assert [(r["curriculum_seqlen"], r["tokens"], r["consumed_tokens"]) for r in z] == \
       [(r["curriculum_seqlen"], r["tokens"], r["consumed_tokens"]) for r in one], (z, one)
PY
# The same with random-LTD: each rank draws for its own sequences (global index rank x rows + b),
# so the 2 ranks drop what the single process dropped and give its losses and layer tokens.
python3 - "$tmp/ltd_seqlen_truncate.json" "$tmp/zl.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"] = {"stage": 2}
c["train_micro_batch_size_per_gpu"] = 1
c["train_batch_size"] = 2
c.pop("gradient_accumulation_steps", None)
json.dump(c, open(sys.argv[2], "w"))
PY
port=$(free_port)
"$bin" launch --backend host --num_procs 2 --master_port $port -- "$bin" train --device cpu "${size[@]:0:10}" --batch_size 1 \
  --attention causal --log_interval 2 --deepspeed_config "$tmp/zl.json" --seed 3 --num_steps 6 --loss_log_file "$tmp/zl.csv" \
  --metrics_file "$tmp/zl.jsonl" >"$tmp/zl.txt" 2>&1 || { cat "$tmp/zl.txt"; fail "composed ZeRO 2 on 2 ranks"; }
same_losses "$tmp/ltd_seqlen_truncate.csv" "$tmp/zl.csv" "composed ZeRO 2 on 2 ranks"
python3 - "$tmp/zl.jsonl" "$tmp/ltd_seqlen_truncate.jsonl" <<'PY' || fail "composed ZeRO 2 metrics"
import json, sys
z = [json.loads(l) for l in open(sys.argv[1])]
one = [json.loads(l) for l in open(sys.argv[2])]
key = lambda r: (r["curriculum_seqlen"], r["random_ltd_kept"], r["layer_tokens"], r["consumed_layer_tokens"])
assert [key(r) for r in z] == [key(r) for r in one], (z, one)
PY
echo "ok: ZeRO 2 on 2 host ranks (alone and composed with random-LTD)"
