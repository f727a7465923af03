#!/usr/bin/env bash
# Installs the Debian packages of scripts/deps.txt that are missing (apt), and the PyPI packages of
# scripts/python-deps.txt that python3 cannot import (pip). Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mapfile -t pkgs < <(grep -vE '^\s*(#|$)' "$here/deps.txt")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! command -v nvcc >/dev/null; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "install-deps: nvcc is at /usr/local/cuda/bin; add it to PATH (export PATH=/usr/local/cuda/bin:\$PATH)" >&2
  else
    echo "install-deps: the CUDA toolkit (nvcc) is required and was not found" >&2
  fi
  exit 1
fi
# The Python package's build and test modules (scripts/python-deps.txt), for the PATH's python3.
py_missing=()
while read -r mod pkg; do
  python3 -c "import $mod" 2>/dev/null || py_missing+=("$pkg")
done < <(grep -vE '^\s*(#|$)' "$here/python-deps.txt")
if ((${#py_missing[@]})); then
  echo "install-deps: pip installing ${py_missing[*]}"
  python3 -m pip install -q "${py_missing[@]}" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "${py_missing[@]}"
fi
echo "install-deps: all dependencies present"
