# Sourced by the end-to-end scripts (tests/e2e/*.sh, run as SCRIPT CUTRAIN_BINARY cpu|cuda):
# strict mode, `bin` and `device` from the arguments, the repository root as working directory,
# a temp folder removed on exit, fail(), skip_without_gpu() and the small model sizes.
set -euo pipefail
bin=$1; device=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# exit 77 (ctest: skipped) for the cuda variant on a machine without a GPU
skip_without_gpu() {
  # info's whole output first: `info | grep -q` would end info with SIGPIPE (stdout is line-buffered)
  if [ "$device" = cuda ] && grep -q "no CUDA device" <<<"$("$bin" info 2>&1 || true)"; then echo "no CUDA device: skipped"; exit 77; fi
}
# small_size [LAYERS]: the model flags of a quick run on $device (GPU: head_dim 64, as attention needs)
small_size() {
  if [ "$device" = cuda ]; then
    size=(--hidden_dim 128 --num_heads 2 --num_layers "${1:-2}" --vocab_size 1000 --seq_length 64 --batch_size 2)
  else
    size=(--hidden_dim 32 --num_heads 2 --num_layers 2 --vocab_size 64 --seq_length 8 --batch_size 2)
  fi
}
# free_port: a loopback TCP port that is free now (the kernel's pick for a socket bound to port 0),
# for a rendezvous; a number of our own may be held by another process's outgoing connection.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# same_losses A.csv B.csv WHAT: the loss columns of two --loss_log_file files agree within 1e-6
# relative (WHAT names the run against the single process in the failure)
same_losses() {
  python3 - "$1" "$2" "$3" <<'PY'
import csv, sys
a, b = ([float(r["loss"]) for r in csv.DictReader(open(p))] for p in sys.argv[1:3])
assert len(a) == len(b) and len(a) > 0, (a, b)
for x, y in zip(a, b):
    assert abs(x - y) <= 1e-6 * abs(x), (sys.argv[3] + " != single process", a, b)
PY
}
# clear_launch_env: no launcher's rank variables from the calling environment (the host-launcher
# tests start their own ranks, and a single-process run must not see a rank)
clear_launch_env() {
  unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID GROUP_RANK \
    CUTRAIN_RENDEZVOUS_PORT
}
# zero_world_config STAGE WORLD -> $tmp/sSTAGE_wWORLD.json: configs/baseline.json with that ZeRO
# stage, micro-batch 1 and global batch WORLD
zero_world_config() {
  python3 - "$1" "$2" "$tmp/s$1_w$2.json" <<'PY'
import json, sys
c = json.load(open("configs/baseline.json"))
c["zero_optimization"]["stage"] = int(sys.argv[1])
c["train_micro_batch_size_per_gpu"] = 1
c["train_batch_size"] = int(sys.argv[2])
c.pop("gradient_accumulation_steps")
json.dump(c, open(sys.argv[3], "w"))
PY
}
# wikitext_data_or_skip: $data, the folder with wikitext-2/ and gpt2/ (CUTRAIN_DATA_DIR, else
# ../shared/data, else .devdata); without one the script is skipped (exit 77)
wikitext_data_or_skip() {
  data=${CUTRAIN_DATA_DIR:-$root/../shared/data}
  [ -e "$data/wikitext-2/valid.txt" ] || data=$root/.devdata
  if [ ! -e "$data/wikitext-2/valid.txt" ] || [ ! -e "$data/gpt2/encoder.json" ]; then
    echo "WikiText-2 / GPT-2 files not found (set CUTRAIN_DATA_DIR): skipped"; exit 77
  fi
}
# expect_config_error TEXT CONFIG [FLAGS...]: the script's own `run` (cutrain train with its
# flags) with CONFIG for one step fails, its output holds TEXT, and no step ran before the error
expect_config_error() {
  local text=$1 cfg=$2; shift 2
  if run --deepspeed_config "$cfg" --num_steps 1 "$@" >"$tmp/err.txt" 2>&1; then cat "$tmp/err.txt"; fail "no error for $cfg"; fi
  grep -qF -- "$text" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "error without '$text'"; }
  grep -q "Step 0" "$tmp/err.txt" && fail "a step ran before the error ($cfg)"
  return 0
}
