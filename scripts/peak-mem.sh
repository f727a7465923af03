#!/usr/bin/env bash
# Runs CMD while sampling the GPU's memory.used (nvidia-smi, every 0.1 s) and writes the peak over
# the figure before CMD started, in MiB, to OUTFILE: the whole process as the driver sees it
# (context, workspaces, allocator caches), the same yardstick for cutrain and a peer.
#   scripts/peak-mem.sh OUTFILE CMD [ARGS...]
set -uo pipefail
out=$1; shift
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
idle=$(used)
( while :; do used; sleep 0.1; done ) >"$out.samples" 2>/dev/null &
sampler=$!
"$@"
rc=$?
kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null
sort -n "$out.samples" | tail -1 | awk -v i="$idle" '{print $1 - i}' >"$out"
rm -f "$out.samples"
exit $rc
