#!/usr/bin/env bash
# End to end, data parallel on the CPU backend: `cutrain launch --backend host --num_procs W --
# cutrain train --device cpu` (the host communicator, shared memory) with ZeRO stages 1, 2 and 3
# at world sizes 2, 4 and 8 (and stage 0 at 2), against the single process with the same global
# batch: train_batch_size W with a micro batch of 1, so the single process accumulates W
# micro-batches and each rank runs one. Random data is dealt by rank on the CPU backend, so the
# global batch is the single process's. Checked: the losses (fp32, within 1e-6 relative), the
# saved checkpoint (rank 0 writes the gathered state: the same files, every tensor within 1e-5 of
# the single process's by relative norm, trainer_state.json identical: tests/e2e/compare_checkpoints.py,
# which holds the key bias to Adam's step bound), a resume of the
# single-process checkpoint on 4 ranks at stage 3 that continues the single process's losses, a
# rank that fails (named by the launcher, the others stopped), a rank killed mid-run without a
# launcher (named by the survivor), `comm-check --backend host` and the launcher's bad input.
# GPT-2 and BERT (tied heads) at stage 3 on 2 and 4 ranks against the single process likewise.
#   zero_host_cli.sh CUTRAIN_BINARY cpu|cuda   (the cuda variant exits 77: the host backend is CPU only)
source "$(dirname "$0")/e2e_lib.sh"
[ "$device" = cuda ] && { echo "the host communicator serves the CPU backend: skipped on cuda"; exit 77; }
clear_launch_env
port=$(free_port)
size=(--device cpu --hidden_dim 32 --num_heads 2 --num_layers 2 --vocab_size 64 --seq_length 8 --batch_size 1
      --log_interval 1 --learning_rate 1e-2 --seed 7)


compare() {  # compare SINGLE_DIR DP_DIR STEP: the checkpoints' tensors and trainer state
  python3 tests/e2e/compare_checkpoints.py "$1/global_step$3" "$2/global_step$3" --lr 1e-2 --steps "$3"
}

losses() {  # losses A.csv B.csv: the same steps, within 1e-6 relative
  python3 - "$1" "$2" <<'PY'
import csv, sys
a, b = ([float(r["loss"]) for r in csv.DictReader(open(p))] for p in sys.argv[1:])
assert len(a) == len(b) and len(a) > 0, (a, b)
for x, y in zip(a, b):
    assert abs(x - y) <= 1e-6 * abs(x), ("data parallel != single process", a, b)
PY
}

run_dp() {  # run_dp STAGE WORLD: W ranks against the single process of the same global batch
  local stage=$1 w=$2 name=s$1_w$2 out=$tmp/dp_s$1_w$2.txt
  zero_world_config "$stage" "$w"
  "$bin" launch --backend host --num_procs "$w" --master_port $port -- "$bin" train --deepspeed_config "$tmp/$name.json" \
      "${size[@]}" --num_steps 4 --loss_log_file "$tmp/dp_$name.csv" --save "$tmp/ck_dp_$name" >"$out" 2>&1 \
      || { cat "$out"; fail "$name run"; }
  port=$(free_port)
  for r in $(seq 0 $((w - 1))); do
    grep -q "^\[Rank $r\] ZeRO stage $stage, world size $w over the host (shared memory, test backend) communicator: " \
        "$out" || { cat "$out"; fail "$name: rank $r's ZeRO line"; }
  done
  losses "$tmp/single_w$w.csv" "$tmp/dp_$name.csv" || { cat "$out"; fail "$name: losses"; }
  compare "$tmp/ck_single_w$w" "$tmp/ck_dp_$name" 4 || fail "$name: checkpoint"
  echo "ok: ZeRO stage $stage on $w ranks = the single process (losses, checkpoint)"
}

# comm-check over the host communicator under the host launcher.
"$bin" launch --backend host --num_procs 3 --master_port $port -- "$bin" comm-check --backend host --timeout 30 \
    >"$tmp/cc.txt" 2>&1 || { cat "$tmp/cc.txt"; fail "comm-check --backend host"; }
port=$(free_port)
for r in 0 1 2; do
  grep -q "^rank $r of 3 (torchrun): rendezvous at 127.0.0.1:.* and host (shared memory, test backend) all-reduce ok" \
      "$tmp/cc.txt" || { cat "$tmp/cc.txt"; fail "comm-check --backend host: rank $r"; }
done
echo "ok: comm-check --backend host on 3 ranks"

for w in 2 4 8; do
  zero_world_config 1 "$w"
  "$bin" train --deepspeed_config "$tmp/s1_w$w.json" "${size[@]}" --num_steps 4 --loss_log_file "$tmp/single_w$w.csv" \
      --save "$tmp/ck_single_w$w" >"$tmp/single_w$w.txt" 2>&1 || { cat "$tmp/single_w$w.txt"; fail "single process"; }
  grep -q "accumulation $w)" "$tmp/single_w$w.txt" || { cat "$tmp/single_w$w.txt"; fail "single: accumulation $w"; }
  stages="1 2 3"
  [ "$w" = 2 ] && stages="0 1 2 3"
  for stage in $stages; do run_dp "$stage" "$w"; done
done

# Tied heads at stage 3: GPT-2 (head tied to wte) and BERT (decoder tied to the word embedding;
# no dropout: the ranks' masks are not the single process's micro-batches', docs/bert.md) on 2
# and 4 ranks, against the single process: the same losses and checkpoint. The embedding unit's
# gradient holds both uses' shares (lookup and head) before its reduce-scatter.
python3 - "$tmp/bert.json" <<'PY'
import json, sys
c = json.load(open("configs/bert_tiny.json"))
c.update(batch_size=1, hidden_size=32, heads=2, intermediate_size=64, attn_dropout_ratio=0.0, hidden_dropout_ratio=0.0)
json.dump(c, open(sys.argv[1], "w"))
PY
gpt2_size=(--device cpu --model gpt2 --hidden_dim 32 --num_heads 2 --num_layers 2 --vocab_size 64 --seq_length 8
           --batch_size 1 --log_interval 1 --learning_rate 1e-2 --seed 7)
bert_size=(--device cpu --model bert --bert_config "$tmp/bert.json" --max_seq_length 8 --batch_size 1 --log_interval 1
           --learning_rate 1e-2 --seed 7)
for arch in gpt2 bert; do
  if [ $arch = gpt2 ]; then flags=("${gpt2_size[@]}"); else flags=("${bert_size[@]}"); fi
  for w in 2 4; do
    name=${arch}_w$w
    "$bin" train --deepspeed_config "$tmp/s1_w$w.json" "${flags[@]}" --num_steps 4 --loss_log_file "$tmp/single_$name.csv" \
        --save "$tmp/ck_single_$name" >"$tmp/single_$name.txt" 2>&1 || { cat "$tmp/single_$name.txt"; fail "$name: single process"; }
    "$bin" launch --backend host --num_procs "$w" --master_port $port -- "$bin" train --deepspeed_config "$tmp/s3_w$w.json" \
        "${flags[@]}" --num_steps 4 --loss_log_file "$tmp/dp_$name.csv" --save "$tmp/ck_dp_$name" >"$tmp/dp_$name.txt" 2>&1 \
        || { cat "$tmp/dp_$name.txt"; fail "$name: stage 3 run"; }
    port=$(free_port)
    grep -q "^\[Rank $((w - 1))\] ZeRO stage 3, world size $w over the host .*: sharded" "$tmp/dp_$name.txt" \
        || { cat "$tmp/dp_$name.txt"; fail "$name: the ZeRO line"; }
    losses "$tmp/single_$name.csv" "$tmp/dp_$name.csv" || { cat "$tmp/dp_$name.txt"; fail "$name: losses"; }
    compare "$tmp/ck_single_$name" "$tmp/ck_dp_$name" 4 || fail "$name: checkpoint"
    echo "ok: --model $arch at ZeRO stage 3 on $w ranks = the single process (losses, checkpoint)"
  done
done

# Resume: the single process's step-4 checkpoint on 4 ranks at stage 3 (each rank takes its
# shards) continues as the single process does.
"$bin" train --deepspeed_config "$tmp/s1_w4.json" "${size[@]}" --num_steps 2 --resume "$tmp/ck_single_w4" \
    --loss_log_file "$tmp/single_resumed.csv" >"$tmp/single_resumed.txt" 2>&1 \
    || { cat "$tmp/single_resumed.txt"; fail "single resume"; }
"$bin" launch --backend host --num_procs 4 --master_port $port -- "$bin" train --deepspeed_config "$tmp/s3_w4.json" \
    "${size[@]}" --num_steps 2 --resume "$tmp/ck_single_w4" --loss_log_file "$tmp/dp_resumed.csv" \
    >"$tmp/dp_resumed.txt" 2>&1 || { cat "$tmp/dp_resumed.txt"; fail "4-rank resume"; }
port=$(free_port)
losses "$tmp/single_resumed.csv" "$tmp/dp_resumed.csv" || fail "resumed losses"
grep -q "^4," "$tmp/dp_resumed.csv" || fail "the resumed run starts at step 4"
echo "ok: a single-process checkpoint resumed on 4 ranks at stage 3"

# A rank that fails: the launcher names it and stops the others; no rank hangs.
if "$bin" launch --backend host --num_procs 3 --master_port $port -- bash -c \
    '[ "$RANK" = 1 ] && exit 3; exec "$0" train --deepspeed_config "$1" "${@:2}"' "$bin" "$tmp/s1_w4.json" \
    "${size[@]}" --num_steps 50 >"$tmp/dead.txt" 2>&1; then
  cat "$tmp/dead.txt"; fail "a run with a failing rank succeeded"
fi
port=$(free_port)
grep -q "cutrain launch: rank 1 exited with status 3; stopping the other ranks" "$tmp/dead.txt" \
    || { cat "$tmp/dead.txt"; fail "the failing rank is not named"; }
echo "ok: a failing rank is named and the others stopped"

# A rank killed mid-run without a launcher to stop the others (two ranks started by hand): the
# survivor's error names the dead rank, within seconds rather than the 300 s timeout.
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$bin" train --deepspeed_config "$tmp/s1_w4.json" \
    "${size[@]}" --num_steps 1000000 >"$tmp/killed.txt" 2>&1 &
victim=$!
(sleep 2; kill -KILL $victim) &
t0=$(date +%s)
if RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$bin" train \
    --deepspeed_config "$tmp/s1_w4.json" "${size[@]}" --num_steps 1000000 >"$tmp/survivor.txt" 2>&1; then
  fail "rank 0 finished although rank 1 was killed"; fi
wait 2>/dev/null || true
port=$(free_port)
grep -q "host communicator: rank 0: .*rank 1 (pid [0-9]*) exited without closing the communicator" \
    "$tmp/survivor.txt" || { tail -5 "$tmp/survivor.txt"; fail "the survivor does not name the dead rank"; }
(( $(date +%s) - t0 < 30 )) || fail "the dead rank was found only after $(( $(date +%s) - t0 )) s"
echo "ok: a killed rank is named by the survivor"

# Bad input, refused before any process starts.
expect_refused() {  # expect_refused 'message part' launch-args...
  local want=$1; shift
  if "$bin" launch "$@" -- touch "$tmp/started" >"$tmp/err.txt" 2>&1; then fail "accepted: $*"; fi
  grep -qF -- "$want" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "message for $* lacks: $want"; }
  [ ! -e "$tmp/started" ] || fail "a process started despite: $*"
}
expect_refused "launch --backend host: expected --num_procs N (N >= 1 processes), found none" --backend host
expect_refused "launch --backend host: --num_gpus places GPU processes on nodes" --backend host --num_procs 2 --num_gpus 2
expect_refused "launch: --num_procs 2 starts processes for --backend host" --num_procs 2
expect_refused "the host communicator serves at most 64 ranks" --backend host --num_procs 65
echo "ok: bad launcher input refused"
