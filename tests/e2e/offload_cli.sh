#!/usr/bin/env bash
# End to end: `cutrain offload-bench` and scripts/offload-sweep.sh as the offload example's
# run_benchmark.sh would run them: the output lines, the log, the table; errors for bad flags.
#   offload_cli.sh CUTRAIN_BINARY cpu|cuda   (cpu: the error paths only; cuda: exits 77 = skipped
#   when there is no GPU)
source "$(dirname "$0")/e2e_lib.sh"
expect_error() {  # expect_error PATTERN ARGS...: a non-zero exit with PATTERN in the output
  local pat=$1; shift
  if "$bin" offload-bench "$@" >"$tmp/err.txt" 2>&1; then cat "$tmp/err.txt"; fail "no error for: $*"; fi
  grep -q -- "$pat" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "error for '$*' lacks '$pat'"; }
}

if [ "$device" = cpu ]; then
  expect_error "float16 is not supported" --dtype torch.float16 --log "$tmp/x.log"
  expect_error "must exceed --warmup" --iteration 2 --warmup 3 --log "$tmp/x.log"
  expect_error "torch.bfloat16, torch.float16 or torch.float32" --dtype int8 --log "$tmp/x.log"
  expect_error "not in" --included_state momentum
  expect_error "expected \"cpu\" or \"nvme\"" --device gpu --log "$tmp/x.log"
  if scripts/offload-sweep.sh --trials 0 --cutrain "$bin" >"$tmp/s.txt" 2>&1; then fail "sweep accepted --trials 0"; fi
  grep -q "positive integer" "$tmp/s.txt" || fail "sweep --trials 0 message"
  [ ! -e "$tmp/x.log" ] || fail "a failed run wrote the log"
  echo "PASS (cpu: error paths)"; exit 0
fi

if grep -q "no CUDA device" <<<"$("$bin" info 2>&1 || true)"; then echo "no CUDA device: skipped"; exit 77; fi
size=(--hidden_dim 1024 --nlayers 2 --iteration 4 --warmup 1)
log=$tmp/offload_states.log
for pin in 0 1; do
  for nb in 0 1; do
    flags=(); [ $pin = 1 ] && flags+=(--pin_memory); [ $nb = 1 ] && flags+=(--non_blocking)
    out=$tmp/run_$pin$nb.txt
    "$bin" offload-bench "${flags[@]}" "${size[@]}" --log "$log" >"$out" 2>&1 || { cat "$out"; fail "run pin=$pin nb=$nb"; }
    P=$([ $pin = 1 ] && echo True || echo False); N=$([ $nb = 1 ] && echo True || echo False)
    for i in 0 1 2 3; do
      grep -Eq "^Memory usage \($i\): include=None, pin_memory=$P, non_blocking=$N alloc_before_offload=[0-9]+ alloc_after_offload=[0-9]+$" "$out" \
        || { cat "$out"; fail "Memory usage ($i) line, pin=$pin nb=$nb"; }
    done
    grep -Eq "^Summary: pin_memory=$P non_blocking=$N offload=[0-9.e-]+ load=[0-9.e-]+$" "$out" || { cat "$out"; fail "Summary line"; }
    grep -Eq "^Bandwidth: offload [0-9.]+ GB/s, load [0-9.]+ GB/s .*ratio offload/raw [0-9.]+, load/raw [0-9.]+$" "$out" \
      || { cat "$out"; fail "Bandwidth line"; }
    grep -Eq "^Overlap: step " "$out" || { cat "$out"; fail "Overlap line"; }
  done
done
[ "$(wc -l <"$log")" = 4 ] || fail "offload_states.log should have 4 lines"
grep -Eqx "1,1,[0-9.e-]+,[0-9.e-]+" "$log" || fail "log line format"
# A subset, float32, NVMe.
"$bin" offload-bench --included_state optim_states --included_state lp_grads --pin_memory "${size[@]}" --log "$log" \
  >"$tmp/subset.txt" 2>&1 || { cat "$tmp/subset.txt"; fail "subset run"; }
grep -q "include=\[optim_states, lp_grads\]" "$tmp/subset.txt" || fail "subset include"
"$bin" offload-bench --dtype torch.float32 --pin_memory "${size[@]}" --log "$log" >"$tmp/fp32.txt" 2>&1 \
  || { cat "$tmp/fp32.txt"; fail "float32 run"; }
grep -q "float32" "$tmp/fp32.txt" || fail "float32 header"
mkdir -p "$tmp/nvme"
"$bin" offload-bench --device nvme --nvme_path "$tmp/nvme" "${size[@]}" --log "$log" >"$tmp/nvme.txt" 2>&1 \
  || { cat "$tmp/nvme.txt"; fail "nvme run"; }
grep -q "^Summary:" "$tmp/nvme.txt" || fail "nvme Summary"
expect_error "not a state\|unknown state" --included_state contiguous_grad_buffer "${size[@]}" --log "$tmp/x.log"
# The sweep's table.
scripts/offload-sweep.sh --trials 1 --cutrain "$bin" --log "$tmp/sweep.log" -- --hidden_dim 512 --iteration 3 --warmup 1 \
  >"$tmp/table.md" 2>"$tmp/sweep.err" || { cat "$tmp/sweep.err"; fail "sweep"; }
grep -q "^| trial | pin_memory=0, non_blocking=0 | pin_memory=0, non_blocking=1 | pin_memory=1, non_blocking=0 | pin_memory=1, non_blocking=1 |$" "$tmp/table.md" \
  || { cat "$tmp/table.md"; fail "table header"; }
grep -Eq "^\| 1 \|( [0-9.]+ / [0-9.]+ \|){4}$" "$tmp/table.md" || { cat "$tmp/table.md"; fail "table row"; }
echo "PASS (cuda)"
