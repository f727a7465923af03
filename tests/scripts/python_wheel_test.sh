#!/usr/bin/env bash
# Builds the cutrain wheel from a build tree (scripts/build-wheel.sh), installs it into a fresh
# virtual environment (NumPy and pytest from the interpreter's own site-packages), and runs
# python/tests there against the installed package, from outside the source tree.
#   tests/scripts/python_wheel_test.sh BUILD_DIR PYTHON
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?BUILD_DIR}" && pwd)
py=${2:?PYTHON}
work=$(mktemp -d "${TMPDIR:-/tmp}/cutrain-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The tree's install prefix and SKBUILD variables are put back after the wheel's configure.
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt")
restore() { cmake -U 'SKBUILD*' -DCMAKE_INSTALL_PREFIX="$prefix" "$build" >/dev/null; }
wheel=$("$root/scripts/build-wheel.sh" --build-dir "$build" --python "$py" --out "$work/dist" 2>"$work/wheel.log" | tail -1) \
  || { restore; tail -40 "$work/wheel.log"; exit 1; }
restore
echo "wheel: $(basename "$wheel")"
"$py" -m venv --system-site-packages "$work/venv"
# When PYTHON is itself a virtual environment, --system-site-packages reaches its base interpreter's
# packages only: its own (pytest, NumPy, torch) are added after the new venv's by a .pth file.
"$py" -c 'import site; print("\n".join(site.getsitepackages()))' \
  >"$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/parent-site.pth"
"$work/venv/bin/python" -m pip install -q --no-deps --no-index "$wheel"
cd "$work"
"$work/venv/bin/python" -c "import cutrain, sys; f = cutrain._cutrain.__file__; print('installed:', f); sys.exit(0 if f.startswith('$work/venv') else 1)"
CUTRAIN_TEST_ROOT=$root "$work/venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/python/tests"
