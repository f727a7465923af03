#!/usr/bin/env bash
# Downloads the -dev .deb files the build needs into .deps/ (git-ignored), for a GPU machine
# without package access: pass `carry: [".deps"]` and run scripts/gpu-check.sh there. Also the
# pure-Python wheels that build and test the Python package there (.deps/wheels/: scikit-build-core,
# nanobind, pytest and what they need; pip install --no-index --find-links .deps/wheels).
#   scripts/offline-deps.sh [--wheels-only]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.deps/wheels"
python3 -m pip download -q --only-binary=:all: -d "$root/.deps/wheels" scikit-build-core nanobind pytest
[ "${1:-}" = --wheels-only ] && { ls "$root/.deps/wheels"; exit 0; }
cd "$root/.deps"
# Header-only or static-archive packages: nothing to install at run time on the GPU machine.
pkgs=(nlohmann-json3-dev libcli11-dev liburing-dev liburing2 libaio-dev libaio1 libgtest-dev googletest
      libbenchmark-dev libbenchmark1debian)
apt-get download "${pkgs[@]}"
ls -la "$root/.deps"
