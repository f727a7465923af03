#!/usr/bin/env bash
# End to end: random-LTD in `cutrain train` (data_efficiency.data_routing.random_ltd) on a small
# model: the random-LTD line, the per-interval kept / layer-token lines, finite losses,
# random_ltd_kept / layer_tokens / consumed_layer_tokens in the metrics against the schedule's
# formula (accumulation included), a resumed run's losses and counts equal the straight run's,
# activation checkpointing gives the same losses, the composed curriculum + random-LTD config
# checks, and each bad input named by its JSON path before any step. CPU only: ZeRO stages 0 and
# 2 over the host launcher (2 ranks) give the same losses and the global layer-token figure.
#   random_ltd_cli.sh CUTRAIN_BINARY cpu|cuda
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu
clear_launch_env
if [ "$device" = cuda ]; then
  S=64; size=(--hidden_dim 128 --num_heads 2 --num_layers 3 --vocab_size 1000 --seq_length 64 --batch_size 2)
else
  S=16; size=(--hidden_dim 32 --num_heads 2 --num_layers 3 --vocab_size 64 --seq_length 16 --batch_size 2)
fi
LO=$((S / 4)); PER=$((S / 4))

# make_config OUT KEY=VALUE...: configs/random_ltd.json shrunk to this model (3 blocks, blocks 1
# and 2 dropping, kept S/4 -> S over 4 steps in multiples of S/4), then the overrides (a JSON
# path into the random_ltd block, or accum=N).
make_config() {
  python3 - "$S" "$LO" "$PER" "$@" <<'PY'
import json, sys
S, lo, per, out, *kv = sys.argv[1:]
c = json.load(open("configs/random_ltd.json"))
c.pop("zero_optimization", None)
c["train_micro_batch_size_per_gpu"] = 2
r = c["data_efficiency"]["data_routing"]["random_ltd"]
r.update({"total_layer_num": 3, "random_ltd_layer_num": 2, "random_ltd_layer_id": [1, 2]})
r["random_ltd_schedule"].update({"min_value": int(lo), "max_value": int(S),
                                 "schedule_config": {"require_steps": 4, "seq_per_step": int(per)}})
for item in kv:
    k, v = item.split("=", 1)
    if k == "accum":
        c["gradient_accumulation_steps"] = int(v); continue
    node, *path = k.split(".")
    d = r
    for p in [node] + path[:-1] if path else []:
        d = d[p]
    d[path[-1] if path else node] = json.loads(v)
json.dump(c, open(out, "w"))
PY
}
run() { "$bin" train --device "$device" "${size[@]}" --learning_rate 1e-2 --log_interval 2 --seed 3 "$@"; }

# check_metrics METRICS ACCUM WORLD FIRST: each row's kept count, layer tokens and their sum
# against the schedule (DeepSpeed's fixed_linear) from step FIRST on.
check_metrics() {
  python3 - "$S" "$LO" "$PER" "$@" <<'PY'
import json, math, sys
S, lo, per, path, accum, world, first = map(str, sys.argv[1:])
S, lo, per, accum, world, first = int(S), int(lo), int(per), int(accum), int(world), int(first)
def kept(s):
    v = (s * (S - lo)) // 4 + lo
    return min(v - v % per, S)
rows = [json.loads(l) for l in open(path)]
assert rows and [r["step"] for r in rows] == list(range(first, first + len(rows))), rows
consumed = sum(2 * accum * world * (2 * kept(s) + S) for s in range(first))
for r in rows:
    s = r["step"]
    assert math.isfinite(r["loss"]), r
    assert r["random_ltd_kept"] == kept(s), (s, r["random_ltd_kept"], kept(s))
    want = 2 * accum * world * (2 * kept(s) + (3 - 2) * S)   # B=2 sequences per micro-batch per rank
    assert r["layer_tokens"] == want, (s, r["layer_tokens"], want)
    consumed += want
    assert r["consumed_layer_tokens"] == consumed, (s, r["consumed_layer_tokens"], consumed)
PY
}

make_config "$tmp/ltd.json" model_type='"encoder"'
run --deepspeed_config "$tmp/ltd.json" --num_steps 6 --metrics_file "$tmp/m.jsonl" --loss_log_file "$tmp/straight.csv" \
  >"$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt"; fail "random-LTD run"; }
grep -q "random-LTD: blocks \[1, 2\] keep $LO..$S of $S tokens per sequence over 4 steps (multiples of $PER), encoder" \
  "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "random-LTD line"; }
grep -q "Step 2: random-LTD kept=$((S / 2)) of $S tokens in 2 of 3 blocks, layer_tokens=$((2 * (2 * S / 2 + S))), consumed_layer_tokens=" \
  "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "per-interval random-LTD line"; }
grep -q "random_ltd is read but not acted on" "$tmp/out.txt" && { cat "$tmp/out.txt"; fail "random_ltd still warned"; }
grep -q "data_efficiency.data_routing.random_ltd.model_mask_name is read but not acted on" "$tmp/out.txt" \
  || { cat "$tmp/out.txt"; fail "model_mask_name not warned"; }
check_metrics "$tmp/m.jsonl" 1 1 0 || { cat "$tmp/m.jsonl"; fail "metrics"; }
echo "ok: random-LTD lines, losses finite, kept and layer tokens by the schedule"

# The drop is in effect: the plain run's losses differ (steps 0..3 drop tokens).
run --deepspeed_config configs/bf16_master_wg.json --num_steps 6 --loss_log_file "$tmp/plain.csv" >"$tmp/p.txt" 2>&1 \
  || { cat "$tmp/p.txt"; fail "plain run"; }
[ "$(sed -n 2p "$tmp/plain.csv")" != "$(sed -n 2p "$tmp/straight.csv")" ] || fail "random-LTD changed nothing"

# Resume: 3 steps + save, then 3 from the checkpoint: the same draws, losses and counts.
run --deepspeed_config "$tmp/ltd.json" --num_steps 3 --save "$tmp/ck" >"$tmp/a.txt" 2>&1 || { cat "$tmp/a.txt"; fail "first half"; }
run --deepspeed_config "$tmp/ltd.json" --num_steps 3 --resume "$tmp/ck" --loss_log_file "$tmp/resumed.csv" \
  --metrics_file "$tmp/mr.jsonl" >"$tmp/b.txt" 2>&1 || { cat "$tmp/b.txt"; fail "resumed half"; }
[ "$(tail -n 3 "$tmp/straight.csv")" = "$(tail -n 3 "$tmp/resumed.csv")" ] \
  || { paste "$tmp/straight.csv" "$tmp/resumed.csv"; fail "resumed losses differ from the straight run's"; }
check_metrics "$tmp/mr.jsonl" 1 1 3 || { cat "$tmp/mr.jsonl"; fail "resumed metrics"; }
echo "ok: resumed run draws the same (losses, kept, consumed layer tokens)"

# Activation checkpointing: the same losses; accumulation 2: twice the layer tokens.
run --deepspeed_config "$tmp/ltd.json" --num_steps 4 --activation_checkpointing --loss_log_file "$tmp/ck.csv" \
  >"$tmp/c.txt" 2>&1 || { cat "$tmp/c.txt"; fail "checkpointing run"; }
[ "$(head -n 5 "$tmp/straight.csv")" = "$(cat "$tmp/ck.csv")" ] || { paste "$tmp/straight.csv" "$tmp/ck.csv"; fail "checkpointing changed the losses"; }
make_config "$tmp/acc.json" model_type='"encoder"' accum=2
run --deepspeed_config "$tmp/acc.json" --num_steps 5 --metrics_file "$tmp/ma.jsonl" >"$tmp/d.txt" 2>&1 \
  || { cat "$tmp/d.txt"; fail "accumulation run"; }
check_metrics "$tmp/ma.jsonl" 2 1 0 || { cat "$tmp/ma.jsonl"; fail "accumulation metrics"; }
echo "ok: checkpointing keeps the losses, accumulation counts every micro-batch"

# decoder on a causal model.
make_config "$tmp/dec.json" model_type='"decoder"'
run --deepspeed_config "$tmp/dec.json" --attention causal --num_steps 3 --metrics_file "$tmp/md.jsonl" >"$tmp/e.txt" 2>&1 \
  || { cat "$tmp/e.txt"; fail "decoder run"; }
check_metrics "$tmp/md.jsonl" 1 1 0 || fail "decoder metrics"
echo "ok: decoder (causal) run"

P=data_efficiency.data_routing.random_ltd
make_config "$tmp/e1.json" model_type='"encoder"' random_ltd_schedule.max_value=$((S + 1))
expect_config_error "$P.random_ltd_schedule.max_value: expected at most the sequence length $S (--seq_length), found $((S + 1))" "$tmp/e1.json"
make_config "$tmp/e2.json" model_type='"encoder"' random_ltd_layer_id='[1, 3]'
expect_config_error "$P.random_ltd_layer_id[1]: expected a layer index in [0, total_layer_num 3), found 3" "$tmp/e2.json"
make_config "$tmp/e3.json" model_type='"encoder"' random_ltd_layer_num=3
expect_config_error "$P.random_ltd_layer_num: expected the length of random_ltd_layer_id (2), found 3" "$tmp/e3.json"
make_config "$tmp/e4.json" model_type='"encoder"' random_ltd_schedule.schedule_type='"fixed_root"'
expect_config_error "$P.random_ltd_schedule.schedule_type: expected " "$tmp/e4.json"
grep -q "fixed_root" "$tmp/err.txt" || fail "the unknown schedule type is not quoted"
make_config "$tmp/e5.json" model_type='"encoder"' total_layer_num=4
expect_config_error "$P.total_layer_num: expected the model's block count 3 (--num_layers), found 4" "$tmp/e5.json"
expect_config_error "$P.model_type: expected \"encoder\": this model's attention is not causal" "$tmp/dec.json"
echo "ok: bad input named by JSON path before any step"

# The shipped configs check.
"$bin" check-config configs/random_ltd.json >"$tmp/cc.txt" 2>&1 || { cat "$tmp/cc.txt"; fail "check-config random_ltd.json"; }
"$bin" check-config configs/curriculum_random_ltd.json >"$tmp/cc.txt" 2>&1 \
  || { cat "$tmp/cc.txt"; fail "check-config curriculum_random_ltd.json"; }

# Composed with the vocabularyrarity curriculum (configs/curriculum_random_ltd.json, decoder) on
# a shard written here: both lines, both figures in the metrics, the losses finite.
python3 - "$tmp" <<'PY'
import random, struct, sys
rng = random.Random(5)
n = 4001
toks = [min(rng.randrange(3000), rng.randrange(3000)) for _ in range(n)]
with open(f"{sys.argv[1]}/train.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *toks))
PY
"$bin" analyze-data --data "$tmp/train.bin" --seq_length "$S" --metric vocabularyrarity --output "$tmp/idx.json" >/dev/null
python3 - "$S" "$LO" "$PER" "$tmp/comp.json" <<'PY'
import json, sys
S, lo, per, out = sys.argv[1:]
c = json.load(open("configs/curriculum_random_ltd.json"))
c["train_micro_batch_size_per_gpu"] = 2
m = c["data_efficiency"]["data_sampling"]["curriculum_learning"]["curriculum_metrics"]["vocabularyrarity"]
m["index_to_sample_path"] = m["index_to_metric_path"] = "idx.json"
m["schedule_config"]["total_curriculum_step"] = 6
r = c["data_efficiency"]["data_routing"]["random_ltd"]
r.update({"total_layer_num": 3, "random_ltd_layer_num": 2, "random_ltd_layer_id": [1, 2]})
r["random_ltd_schedule"].update({"min_value": int(lo), "max_value": int(S),
                                 "schedule_config": {"require_steps": 4, "seq_per_step": int(per)}})
json.dump(c, open(out, "w"))
PY
"$bin" train --device "$device" --use_real_data --data "$tmp/train.bin" --hidden_dim "${size[1]}" --num_heads 2   --num_layers 3 --seq_length "$S" --batch_size 2 --learning_rate 1e-2 --log_interval 2 --seed 3   --deepspeed_config "$tmp/comp.json" --num_steps 4 --metrics_file "$tmp/mc.jsonl" >"$tmp/comp.txt" 2>&1   || { cat "$tmp/comp.txt"; fail "composed curriculum + random-LTD run"; }
grep -q "curriculum: vocabularyrarity from" "$tmp/comp.txt" || { cat "$tmp/comp.txt"; fail "composed: curriculum line"; }
grep -q "random-LTD: blocks \[1, 2\] keep .*, decoder" "$tmp/comp.txt" || { cat "$tmp/comp.txt"; fail "composed: random-LTD line"; }
python3 - "$tmp/mc.jsonl" <<'PY' || fail "composed metrics"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 4 and all(math.isfinite(r["loss"]) and "curriculum_difficulty" in r and "layer_tokens" in r
                              for r in rows), rows
PY
check_metrics "$tmp/mc.jsonl" 1 1 0 || fail "composed: layer tokens"
echo "ok: composed with the vocabularyrarity curriculum"

[ "$device" = cpu ] || exit 0
# ZeRO over the host launcher: 2 ranks at stages 0 and 2 give the same losses; the layer tokens
# are the global batch's.
port=$(free_port)
for stage in 0 2; do
  python3 - "$tmp/ltd.json" "$stage" "$tmp/z$stage.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"] = {"stage": int(sys.argv[2])}
json.dump(c, open(sys.argv[3], "w"))
PY
  "$bin" launch --backend host --num_procs 2 --master_port $port -- "$bin" train --device cpu "${size[@]}" \
      --deepspeed_config "$tmp/z$stage.json" --learning_rate 1e-2 --seed 3 --num_steps 4 --loss_log_file "$tmp/z$stage.csv" \
      --metrics_file "$tmp/z$stage.jsonl" >"$tmp/z$stage.txt" 2>&1 || { cat "$tmp/z$stage.txt"; fail "ZeRO $stage"; }
  port=$(free_port)
  check_metrics "$tmp/z$stage.jsonl" 1 2 0 || { cat "$tmp/z$stage.jsonl"; fail "ZeRO $stage metrics"; }
done
python3 - "$tmp/z0.csv" "$tmp/z2.csv" <<'PY' || fail "ZeRO 2 != ZeRO 0 under random-LTD"
import csv, math, sys
a, b = ([float(r["loss"]) for r in csv.DictReader(open(p))] for p in sys.argv[1:])
assert len(a) == len(b) == 4 and all(math.isfinite(x) for x in a), (a, b)
assert all(abs(x - y) <= 1e-6 * abs(x) for x, y in zip(a, b)), (a, b)
PY
echo "ok: random-LTD under ZeRO 0 and 2 on 2 host ranks"
