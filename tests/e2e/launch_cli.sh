#!/usr/bin/env bash
# The launcher conventions of DeepSpeed and PyTorch users, through the `cutrain` binary (CPU: no
# NCCL; the rendezvous is the TCP id hand-out, over 127.0.0.1 only):
#   - cutrain launch with the deepspeed launcher's flags: --num_gpus, --hostfile with --include /
#     --exclude, --num_nodes, --node_rank; each rank's variables; bad input fails before any
#     process starts, naming the flag or file;
#   - comm-check under cutrain launch (MASTER_PORT) and under torchrun's variables set by hand with
#     a stand-in for torchrun's TCPStore listening on MASTER_PORT (the rendezvous takes
#     MASTER_PORT + 1), and the port-clash message;
#   - --local_rank (DeepSpeed's launcher) on train and comm-check, and its disagreement with LOCAL_RANK.
#   launch_cli.sh CUTRAIN_BINARY cpu|cuda   (the cuda variant exits 77: these checks need no GPU)
source "$(dirname "$0")/e2e_lib.sh"
[ "$device" = cuda ] && { echo "CPU checks only: skipped"; exit 77; }
unset CUDA_VISIBLE_DEVICES RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT \
  TORCHELASTIC_RUN_ID GROUP_RANK CUTRAIN_RENDEZVOUS_PORT
# comm-check runs below see no GPU (CUDA_VISIBLE_DEVICES empty), so they check the rendezvous and
# the flags alone, as on a machine without one, also where two ranks share one GPU or more.
port=$((20000 + (RANDOM % 10000) * 2))
record='echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT ${CUDA_VISIBLE_DEVICES-unset}" >"$0/r$RANK"'

# --- one node, --num_gpus ---
mkdir "$tmp/a"
"$bin" launch --num_gpus 2 --master_port "$port" -- sh -c "$record" "$tmp/a" || fail "launch --num_gpus 2"
[ "$(cat "$tmp/a/r0")" = "0 0 2 2 127.0.0.1 $port unset" ] || fail "rank 0's variables: $(cat "$tmp/a/r0")"
[ "$(cat "$tmp/a/r1")" = "1 1 2 2 127.0.0.1 $port unset" ] || fail "rank 1's variables: $(cat "$tmp/a/r1")"

# --- a hostfile of two nodes, an include filter: this machine is "localhost", node 0 ---
printf '# two nodes\nlocalhost slots=4\n\nnodeb slots=2  # the second\n' >"$tmp/hostfile"
mkdir "$tmp/b"
"$bin" launch --hostfile "$tmp/hostfile" --include 'localhost:1,3@nodeb' --master_port "$port" \
  -- sh -c "$record" "$tmp/b" 2>"$tmp/b.err" || { cat "$tmp/b.err"; fail "launch with a hostfile"; }
[ "$(cat "$tmp/b/r0")" = "0 0 4 2 localhost $port 1,3" ] || fail "node 0 rank 0: $(cat "$tmp/b/r0")"
[ "$(cat "$tmp/b/r1")" = "1 1 4 2 localhost $port 1,3" ] || fail "node 0 rank 1: $(cat "$tmp/b/r1")"
grep -q "on nodeb: cutrain launch --hostfile $tmp/hostfile --include 'localhost:1,3@nodeb' .*--node_rank 1 --" \
  "$tmp/b.err" || { cat "$tmp/b.err"; fail "the command for the other node"; }
# The other node's processes (run here with --node_rank 1): global ranks 2 and 3.
mkdir "$tmp/c"
"$bin" launch --hostfile "$tmp/hostfile" --include 'localhost:1,3@nodeb' --node_rank 1 --master_port "$port" \
  -- sh -c "$record" "$tmp/c" 2>/dev/null || fail "launch --node_rank 1"
[ "$(cat "$tmp/c/r2")" = "2 0 4 2 localhost $port unset" ] || fail "node 1 rank 2: $(cat "$tmp/c/r2")"
[ -f "$tmp/c/r3" ] || fail "node 1 rank 3 missing"
# --exclude and --num_gpus: the first slots left on each host.
mkdir "$tmp/d"
"$bin" launch --hostfile "$tmp/hostfile" --exclude 'localhost:0' --num_gpus 2 --num_nodes 1 --master_port "$port" \
  -- sh -c "$record" "$tmp/d" || fail "launch --exclude --num_gpus --num_nodes"
[ "$(cat "$tmp/d/r1")" = "1 1 2 2 127.0.0.1 $port 1,2" ] || fail "exclude + num_gpus: $(cat "$tmp/d/r1")"

# --- bad input: an error naming the flag or file, and no process started ---
printf 'localhost slots=2\nnodeb four\n' >"$tmp/bad_hostfile"
expect_refused() {  # expect_refused 'message part' launch-args...
  local want=$1; shift
  if "$bin" launch "$@" -- touch "$tmp/started" >"$tmp/err.txt" 2>&1; then fail "accepted: $*"; fi
  grep -qF -- "$want" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "message for $* lacks: $want"; }
  [ ! -e "$tmp/started" ] || fail "a process started despite: $*"
}
expect_refused "--hostfile $tmp/missing: expected a readable hostfile" --hostfile "$tmp/missing"
expect_refused "$tmp/bad_hostfile:2: expected \`hostname slots=N\` (DeepSpeed's hostfile format), found 'nodeb four'" \
  --hostfile "$tmp/bad_hostfile"
expect_refused "found both" --hostfile "$tmp/hostfile" --include localhost --exclude nodeb
expect_refused "expected a host of --hostfile $tmp/hostfile (localhost, nodeb), found 'nodec'" \
  --hostfile "$tmp/hostfile" --include 'nodec:0'
expect_refused "found slot 7" --hostfile "$tmp/hostfile" --include 'localhost:7'
expect_refused "--num_gpus 3: expected at most the slots of each host, found nodeb with 2" \
  --hostfile "$tmp/hostfile" --num_gpus 3
expect_refused "--num_nodes 2: expected at most the 1 host(s)" --num_nodes 2
printf 'node-x slots=2\n' >"$tmp/elsewhere"
expect_refused "expected this machine" --hostfile "$tmp/elsewhere"

# --- comm-check under cutrain launch: rank 0 listens on MASTER_PORT ---
CUDA_VISIBLE_DEVICES= "$bin" launch --num_gpus 2 --master_port "$port" -- "$bin" comm-check --timeout 30 >"$tmp/cc.txt" 2>&1 \
  || { cat "$tmp/cc.txt"; fail "comm-check under cutrain launch"; }
[ "$(grep -c "rendezvous ok at 127.0.0.1:$port (from MASTER_PORT)" "$tmp/cc.txt")" = 2 ] \
  || { cat "$tmp/cc.txt"; fail "comm-check lines under cutrain launch"; }

# --- torchrun: its TCPStore (a stand-in listener here) holds MASTER_PORT ---
listen() {  # listen PORT: a listener on 127.0.0.1:PORT in the background; its pid in $listener
  python3 -c "import socket,sys,time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT, not a listener
s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(8); print('up', flush=True); time.sleep(120)" "$1" >"$tmp/listen$1" &
  listener=$!
  for _ in $(seq 50); do grep -q up "$tmp/listen$1" 2>/dev/null && return 0; sleep 0.1; done
  fail "listener on $1 did not start"
}
listen "$port"; store=$listener
trap 'kill $store ${other-} 2>/dev/null; rm -rf "$tmp"' EXIT
torchrun_env() {  # torchrun_env RANK: what torchrun's agent sets for a worker of a 2-process job
  echo RANK=$1 LOCAL_RANK=$1 GROUP_RANK=0 ROLE_RANK=$1 ROLE_NAME=default WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 \
    ROLE_WORLD_SIZE=2 GROUP_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TORCHELASTIC_RUN_ID=none \
    TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=0 TORCHELASTIC_USE_AGENT_STORE=True CUDA_VISIBLE_DEVICES=
}
env $(torchrun_env 1) "$bin" comm-check --timeout 30 >"$tmp/t1.txt" 2>&1 &
rank1=$!
env $(torchrun_env 0) "$bin" comm-check --timeout 30 >"$tmp/t0.txt" 2>&1 || { cat "$tmp/t0.txt"; fail "torchrun rank 0"; }
wait $rank1 || { cat "$tmp/t1.txt"; fail "torchrun rank 1"; }
grep -q "rendezvous ok at 127.0.0.1:$((port + 1)) (from MASTER_PORT + 1 (torchrun's TCPStore listens on MASTER_PORT" \
  "$tmp/t0.txt" || { cat "$tmp/t0.txt"; fail "torchrun rank 0's line"; }
# Another job on MASTER_PORT + 1 too: rank 0 names the port and the way out.
listen $((port + 1)); other=$listener
if env $(torchrun_env 0) "$bin" comm-check --timeout 2 >"$tmp/clash.txt" 2>&1; then fail "port clash accepted"; fi
grep -q "cannot listen on port $((port + 1)), the port from MASTER_PORT + 1" "$tmp/clash.txt" \
  || { cat "$tmp/clash.txt"; fail "clash message: port"; }
grep -q "set CUTRAIN_RENDEZVOUS_PORT to a free port" "$tmp/clash.txt" || { cat "$tmp/clash.txt"; fail "clash message: fix"; }
# The override, on both ranks.
free=$((port + 2))
env $(torchrun_env 1) CUTRAIN_RENDEZVOUS_PORT=$free "$bin" comm-check --timeout 30 >"$tmp/o1.txt" 2>&1 &
rank1=$!
env $(torchrun_env 0) CUTRAIN_RENDEZVOUS_PORT=$free "$bin" comm-check --timeout 30 >"$tmp/o0.txt" 2>&1 \
  || { cat "$tmp/o0.txt"; fail "CUTRAIN_RENDEZVOUS_PORT rank 0"; }
wait $rank1 || { cat "$tmp/o1.txt"; fail "CUTRAIN_RENDEZVOUS_PORT rank 1"; }
grep -q "rendezvous ok at 127.0.0.1:$free (from CUTRAIN_RENDEZVOUS_PORT)" "$tmp/o0.txt" || { cat "$tmp/o0.txt"; fail "override line"; }

# --- --local_rank, as DeepSpeed's launcher passes it ---
small_size
train=(train --deepspeed_config configs/baseline.json --device cpu "${size[@]}" --num_steps 2 --warmup_steps 1)
LOCAL_RANK=0 "$bin" "${train[@]}" --local_rank=0 >"$tmp/lr.txt" 2>&1 || { cat "$tmp/lr.txt"; fail "--local_rank=0"; }
"$bin" "${train[@]}" --local_rank 0 >"$tmp/lr.txt" 2>&1 || { cat "$tmp/lr.txt"; fail "--local_rank 0"; }
if LOCAL_RANK=0 "$bin" "${train[@]}" --local_rank=1 >"$tmp/lr_bad.txt" 2>&1; then fail "--local_rank=1 with LOCAL_RANK=0"; fi
grep -q "\-\-local_rank=1 disagrees with environment variable LOCAL_RANK=0" "$tmp/lr_bad.txt" \
  || { cat "$tmp/lr_bad.txt"; fail "--local_rank message"; }
if LOCAL_RANK=1 CUDA_VISIBLE_DEVICES= "$bin" comm-check --local_rank 0 >"$tmp/lr_cc.txt" 2>&1; then fail "comm-check --local_rank 0 with LOCAL_RANK=1"; fi
grep -q "\-\-local_rank=0 disagrees with environment variable LOCAL_RANK=1" "$tmp/lr_cc.txt" \
  || { cat "$tmp/lr_cc.txt"; fail "comm-check --local_rank message"; }
echo "PASS"
