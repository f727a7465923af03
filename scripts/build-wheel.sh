#!/usr/bin/env bash
# Builds the `cutrain` wheel (pyproject.toml: scikit-build-core, the _cutrain target of the top
# CMakeLists.txt) from an existing build tree, so that the libraries it links are not compiled a
# second time; the tree's generator and cache are kept.
#   scripts/build-wheel.sh --build-dir DIR [--python PY] [--out WHEEL_DIR]
# Prints the wheel's path last. scikit-build-core and nanobind must be importable by PY
# (scripts/install-deps.sh installs them; offline: pip install --no-index --find-links .deps/wheels).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=""; py=python3; out=""
while (($#)); do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "build-wheel: unknown option $1 (expected --build-dir DIR, --python PY, --out DIR)" >&2; exit 2 ;;
  esac
done
[ -n "$build" ] || { echo "build-wheel: --build-dir DIR is required (a configured cutrain build tree)" >&2; exit 2; }
build=$(cd "$build" && pwd)
out=${out:-$build/wheel}
mkdir -p "$out"
home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
[ -z "$home" ] || [ "$(cd "$home" && pwd)" = "$root" ] ||
  { echo "build-wheel: $build was configured from $home, not $root" >&2; exit 2; }
# scikit-build-core deletes a tree's cache (tests, benchmarks and every -D with it) when its own
# install path differs from the last run's (.skbuild-info.json); the tree is this source's, checked
# above, so the record goes and the cache stays.
rm -f "$build/.skbuild-info.json"
gen=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
[ -n "$gen" ] && export CMAKE_GENERATOR="$gen"
for m in scikit_build_core nanobind; do
  "$py" -c "import $m" 2>/dev/null || { echo "build-wheel: $py cannot import $m (scripts/install-deps.sh installs it)" >&2; exit 1; }
done
cd "$root"
rm -f "$out"/cutrain-*.whl
"$py" -m pip wheel --no-build-isolation --no-deps --no-index -w "$out" -C build-dir="$build" \
  -C cmake.define.CUTRAIN_BUILD_PYTHON=ON . >&2
ls "$out"/cutrain-*.whl
