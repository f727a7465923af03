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
