#!/usr/bin/env bash
# Runs the whole microbenchmark suite (every bench_* binary of a build) with --benchmark_out JSON
# and merges the results into one JSON with the device name, driver, git commit and date
# (bench/merge_runs.py). Compare two such files with bench/compare_runs.py A.json B.json.
#
#   scripts/bench-all.sh [--build DIR] [--out FILE.json] [--bench REGEX] [--filter REGEX] [--commit C] [-- ARGS...]
#
#   --build   build directory holding bench/bench_* (default build/release)
#   --out     merged result (default DIR/bench-run-<commit>-<UTC time>.json)
#   --bench   only binaries whose name matches REGEX (grep -E), e.g. 'gemm|attention'
#   --filter  passed as --benchmark_filter=REGEX to every binary
#   --commit  the commit recorded in the result (default: git's HEAD, else the file COMMIT beside
#             this script's tree, as a device snapshot has it)
#   ARGS      passed to every binary as they are (e.g. --benchmark_repetitions=3)
# Exit code: 0 when every binary exited 0, 1 otherwise (the merged file is written either way),
# 2 on bad usage.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build/release; out=""; bench_re="."; filter=""; commit=""; extra=()
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --bench) bench_re=$2; shift 2 ;;
    --filter) filter=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "bench-all: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
command -v python3 >/dev/null || { echo "bench-all: python3 is needed to merge the results" >&2; exit 2; }
[ -d "$build/bench" ] || { echo "bench-all: no $build/bench: build first (cmake --build --preset release)" >&2; exit 2; }

# --verify: outside a checkout plain rev-parse echoes "HEAD" before failing (seen on the GPU machine)
[ -n "$commit" ] || commit=$(git -C "$root" rev-parse --verify -q HEAD 2>/dev/null || cat "$root/COMMIT" 2>/dev/null || echo unknown)
dirty=(); [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ] && dirty=(--dirty)
date=$(date -u +%FT%TZ)
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0 2>/dev/null | head -1)
device=${gpu%%,*}; driver=${gpu#*, }
[ -n "$gpu" ] || { device="none (nvidia-smi failed)"; driver=unknown; }
[ -n "$out" ] || out=$build/bench-run-${commit:0:12}-$(date -u +%Y%m%dT%H%M%SZ).json
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-all.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

files=(); rcs=(); status=0; ran=0
for b in "$build"/bench/bench_*; do
  [ -f "$b" ] && [ -x "$b" ] || continue
  name=$(basename "$b")
  echo "$name" | grep -qE -- "$bench_re" || continue
  args=(--benchmark_out="$tmp/$name.json" --benchmark_out_format=json)
  [ -n "$filter" ] && args+=(--benchmark_filter="$filter")
  echo "== $name" >&2
  "$b" "${args[@]}" "${extra[@]}" >"$tmp/$name.txt" 2>&1
  rc=$?
  ran=$((ran + 1))
  tail -n +1 "$tmp/$name.txt" | grep -vE '^\s*$' | tail -n 40 >&2
  ((rc == 0)) || { echo "bench-all: $name exited $rc" >&2; status=1; }
  rcs+=(--rc "$name=$rc")
  [ -s "$tmp/$name.json" ] && files+=("$tmp/$name.json")
done
((ran > 0)) || { echo "bench-all: no bench_* binary in $build/bench matches '$bench_re'" >&2; exit 2; }
python3 "$root/bench/merge_runs.py" --out "$out" --device "$device" --driver "$driver" --commit "$commit" \
    "${dirty[@]}" --date "$date" "${rcs[@]}" "${files[@]}" || exit 2
echo "$out"
exit $status
