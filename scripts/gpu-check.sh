#!/usr/bin/env bash
# On a GPU machine without package access: unpack .deps/ into a prefix, configure against it,
# build with all cores, run every test (GPU ones included) and the benchmark suite, and write
# logs plus a short summary to ${OUT:-build/gpu-check}.
#
#   scripts/gpu-check.sh [--tests REGEX] [--bench REGEX|none] [--peers] [--then "CMD"]
#   CTEST_JOBS (default 8) tests at once, each within CTEST_TIMEOUT seconds (default 300);
#   BUILD_TARGETS: build only these targets (space-separated; the tests of others are not built).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/build/gpu-check}
mkdir -p "$out/logs"
tests_re=""; bench_re="."; peers=0; then_cmd=""
while (($#)); do
  case "$1" in
    --tests) tests_re=$2; shift 2 ;;
    --bench) bench_re=$2; shift 2 ;;
    --peers) peers=1; shift ;;
    --then) then_cmd=$2; shift 2 ;;
    *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
  esac
done
summary=$out/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

prefix=/tmp/cutrain-deps
mkdir -p "$prefix"
for f in .deps/*.deb; do
  [ -e "$f" ] || { say "gpu-check: .deps/ is empty: run scripts/offline-deps.sh here and carry .deps"; break; }
  case "$(basename "$f")" in
    # Prefer the machine's own GoogleTest/Benchmark when it has them.
    libgtest-dev*|googletest*) [ -e /usr/include/gtest/gtest.h ] && continue ;;
    libbenchmark*) [ -e /usr/include/benchmark/benchmark.h ] && continue ;;
  esac
  dpkg -x "$f" "$prefix"
done
export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

commit=$(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo nogit)
say "== $(date -u +%FT%TZ) $commit on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
build=$root/build/gpu
gen=""; command -v ninja >/dev/null && gen="-G Ninja"
t0=$(date +%s)
if ! cmake -S . -B "$build" $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
      >"$out/logs/configure.log" 2>&1; then
  say "configure FAILED"; tail -40 "$out/logs/configure.log" | tee -a "$summary"; exit 1
fi
targets=(); [ -n "${BUILD_TARGETS:-}" ] && targets=(--target $BUILD_TARGETS)  # a short call: only these
if ! cmake --build "$build" -j"$(nproc)" "${targets[@]}" >"$out/logs/build.log" 2>&1; then
  say "build FAILED (continuing with what built)"; grep -E 'error|Error' "$out/logs/build.log" | head -40 | tee -a "$summary"
  cmake --build "$build" -j"$(nproc)" "${targets[@]}" -- -k 0 >>"$out/logs/build.log" 2>&1
fi
say "build: $(( $(date +%s) - t0 )) s"

# GPU tests are small except a few (they check free memory and skip): 8 at once on one GPU keeps
# the 800-odd test processes (each pays the CUDA start-up) to a couple of minutes.
ctest_args=(--test-dir "$build" --output-on-failure --timeout "${CTEST_TIMEOUT:-300}" -j "${CTEST_JOBS:-8}" --output-junit "$out/logs/ctest.xml")
[ -n "$tests_re" ] && ctest_args+=(-R "$tests_re")
# A --tests regex that names no built test runs nothing: say so (ctest -R is case-sensitive, and
# GoogleTest's cases are named Suite.Test, e.g. AttentionHopperGpu.*, not by their binary).
if [ -n "$tests_re" ] && [ "$tests_re" != '^$' ]; then
  n_built=$(ctest --test-dir "$build" -N -R "$tests_re" 2>/dev/null | grep -E '^ *Test +#' | grep -vc '_NOT_BUILT')
  [ "$n_built" = 0 ] && say "tests: '$tests_re' matches no built test (case-sensitive; GoogleTest cases are Suite.Test)"
fi
ctest "${ctest_args[@]}" >"$out/logs/test.log" 2>&1
test_rc=$?
grep -E "tests passed|tests failed|\*\*\*Failed|Exception|Timeout|NOT_BUILT" "$out/logs/test.log" | head -80 | tee -a "$summary"
echo "skipped: $(grep -c '\*\*\*Skipped' "$out/logs/test.log")" | tee -a "$summary"
say "ctest rc=$test_rc"

if [ "$bench_re" != "none" ]; then
  for b in "$build"/bench/bench_*; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    echo "$name" | grep -qE "$bench_re" || continue
    timeout "${BENCH_TIMEOUT:-240}" "$b" --benchmark_out="$out/logs/$name.json" --benchmark_out_format=json \
         --benchmark_counters_tabular=true ${BENCH_FILTER:+--benchmark_filter="$BENCH_FILTER"} >"$out/logs/$name.txt" 2>&1
    say "-- $name (rc=$?)"
    grep -vE '^\s*$' "$out/logs/$name.txt" | tail -n +3 | cut -c1-200 | tee -a "$summary" >/dev/null
  done
fi
if ((peers)); then
  for p in bench/peers/*_peer.py; do
    [ -e "$p" ] || continue
    n=$(basename "$p" .py)
    timeout 300 python3 "$p" --out "$out/logs/$n.json" >"$out/logs/$n.txt" 2>&1
    say "-- peer $n (rc=$?)"
  done
  python3 bench/peers/compare.py --ours "$out"/logs/bench_*.json --peers "$out"/logs/*_peer.json \
      | tee -a "$summary"
fi
if [ -n "$then_cmd" ]; then
  say "-- then: $then_cmd"
  bash -c "$then_cmd" >"$out/logs/then.log" 2>&1
  say "then rc=$?"; tail -60 "$out/logs/then.log" >>"$summary"
fi
tar -C "$out" -czf "$out/logs.tar.gz" logs && rm -rf "$out/logs"
exit $test_rc
