#!/usr/bin/env bash
# Installs a build tree into a fresh prefix (cmake --install, component devel: libraries, headers,
# cutrainConfig.cmake), then configures, builds and runs examples/find_package against that prefix
# alone: find_package(cutrain 0.1) and its targets, as another project sees them.
#   tests/scripts/find_package_test.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?BUILD_DIR}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/cutrain-find-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" --component devel >"$work/install.log"
test -f "$work/prefix/lib/cmake/cutrain/cutrainConfig.cmake" || { echo "no cutrainConfig.cmake installed"; exit 1; }
test -f "$work/prefix/include/cutrain/runtime/aio/aio_handle.h" || { echo "headers not installed"; exit 1; }
gen=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build/CMakeCache.txt")
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
# The prefix to find it in, then the build's own prefix path (where its dependencies were found,
# e.g. an unpacked offline liburing), and not the build tree's package registry.
deps=$(sed -n 's/^CMAKE_PREFIX_PATH:[A-Z]*=//p' "$build/CMakeCache.txt")
cmake -S "$root/examples/find_package" -B "$work/build" -G "$gen" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$work/prefix${deps:+;$deps}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  >"$work/configure.log" || { cat "$work/configure.log"; exit 1; }
grep "example: cutrain" "$work/configure.log"
cmake --build "$work/build" -j2 >"$work/build.log" || { tail -40 "$work/build.log"; exit 1; }
"$work/build/aio_roundtrip" "$work" "$root/configs/bf16_full.json"
"$work/build/kernel_check"
# A version this build is not: 0.x is compatible only within its minor version.
if cmake -S "$root/examples/find_package" -B "$work/build_v9" -G "$gen" -DCMAKE_PREFIX_PATH="$work/prefix${deps:+;$deps}" \
     -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCUTRAIN_EXAMPLE_VERSION=9.0 >"$work/v9.log" 2>&1; then
  echo "find_package(cutrain 9.0) was accepted by a $(sed -n 's/.*PACKAGE_VERSION "\(.*\)".*/\1/p' "$work/prefix/lib/cmake/cutrain/cutrainConfigVersion.cmake" | head -1) install"
  exit 1
fi
grep -q "compatible with requested version \"9.0\"" "$work/v9.log" || { cat "$work/v9.log"; exit 1; }
echo "find_package_test: ok"
