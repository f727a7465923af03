#!/usr/bin/env bash
# The offload example's run_benchmark.sh + output_table.py: `cutrain offload-bench` for the four
# pin_memory x non_blocking combinations over N trials, then a markdown table with one column per
# combination and one row per trial, cells "offload / load" in seconds.
#   scripts/offload-sweep.sh [--trials N] [--cutrain PATH] [--log FILE] [-- offload-bench args...]
#   e.g. scripts/offload-sweep.sh --trials 3 -- --hidden_dim 16384 --nlayers 4   (16 GiB of state)
# Each run skips the raw-copy anchor and the overlap measurement (--no_extras); run
# `cutrain offload-bench` alone for those.
set -euo pipefail
trials=3
cutrain="${CUTRAIN:-build/release/tools/cutrain}"
log=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --trials) trials="$2"; shift 2 ;;
    --cutrain) cutrain="$2"; shift 2 ;;
    --log) log="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "offload-sweep: unknown argument '$1' (benchmark arguments go after --)" >&2; exit 2 ;;
  esac
done
[[ -x "$cutrain" ]] || { echo "offload-sweep: no cutrain binary at '$cutrain' (build it or pass --cutrain)" >&2; exit 2; }
[[ "$trials" =~ ^[1-9][0-9]*$ ]] || { echo "offload-sweep: --trials must be a positive integer, got '$trials'" >&2; exit 2; }
if [[ -z "$log" ]]; then log="$(mktemp -t offload_states.XXXXXX.log)"; else : > "$log"; fi

for trial in $(seq 1 "$trials"); do
  for pin in 0 1; do
    for nb in 0 1; do
      flags=()
      [[ $pin == 1 ]] && flags+=(--pin_memory)
      [[ $nb == 1 ]] && flags+=(--non_blocking)
      echo "== trial $trial: pin_memory=$pin non_blocking=$nb" >&2
      "$cutrain" offload-bench "${flags[@]}" --no_extras --log "$log" "$@" | grep -E '^(Summary|Bandwidth):' >&2
    done
  done
done

# The table: log lines are pin,non_blocking,offload_s,load_s in run order.
awk -F, -v trials="$trials" '
  { key = $1 "," $2; n[key]++; cell[key, n[key]] = sprintf("%.3f / %.3f", $3, $4) }
  END {
    split("0,0 0,1 1,0 1,1", keys, " ")
    printf "| trial |"
    for (k = 1; k <= 4; k++) { split(keys[k], pn, ","); printf " pin_memory=%s, non_blocking=%s |", pn[1], pn[2] }
    printf "\n|---|"
    for (k = 1; k <= 4; k++) printf "---|"
    printf "\n"
    for (t = 1; t <= trials; t++) {
      printf "| %d |", t
      for (k = 1; k <= 4; k++) printf " %s |", ((keys[k], t) in cell) ? cell[keys[k], t] : "-"
      printf "\n"
    }
  }' "$log"
echo "(offload / load seconds, mean over the iterations after warm-up; log: $log)" >&2
