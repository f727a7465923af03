#!/usr/bin/env bash
# The top level refuses CUDA architectures without 90 before anything else is configured (the
# attention kernels are sm_90a only): configuring this source tree for sm_80 must fail, naming the
# architectures it was given and the fix. Usage: configure_arch_test.sh <source dir>
set -u
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$(cmake -S "$src" -B "$tmp/build" -DCMAKE_CUDA_ARCHITECTURES=80 2>&1)
rc=$?
if [ "$rc" -eq 0 ]; then
  echo "FAIL: configuring for CMAKE_CUDA_ARCHITECTURES=80 succeeded; expected a refusal"
  exit 1
fi
for needle in "CMAKE_CUDA_ARCHITECTURES is '80', which lacks 90" "-DCMAKE_CUDA_ARCHITECTURES=90"; do
  if ! grep -qF -- "$needle" <<<"$out"; then
    echo "FAIL: the refusal does not say '$needle'; cmake said:"
    echo "$out"
    exit 1
  fi
done
echo "refused as expected: $(grep -F "lacks 90" <<<"$out" | head -1)"
