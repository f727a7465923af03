#!/usr/bin/env bash
# Prepares .snap/ for a device call: the committed tree (git archive HEAD, so other people's
# uncommitted edits cannot break the device build), the offline .deb files (.deps/, made by
# scripts/offline-deps.sh when missing), the test data from ../shared/data (.devdata/) and llm.c
# from ../shared/peers with DeepSpeed's wheels (.peers/).
# Then call the device with carry [".snap"] and: cd .snap && scripts/device-session.sh
#   scripts/device-snapshot.sh [--against REV]
# --against REV also puts REV's tree into .snap/against/ (with its COMMIT), for the session's
# `against` section: the same benchmarks from both builds, in rounds, in the same call.
set -euo pipefail
against=""
while (($#)); do
  case "$1" in
    --against) against=$2; shift 2 ;;
    *) echo "device-snapshot: unknown option $1 (expected --against REV)" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ -d .deps ] && ls .deps/*.deb >/dev/null 2>&1 || scripts/offline-deps.sh
ls .deps/wheels/nanobind-*.whl >/dev/null 2>&1 || scripts/offline-deps.sh --wheels-only
if [ ! -d .devdata ] && [ -d ../shared/data ]; then
  mkdir -p .devdata && cp -r ../shared/data/gpt2 ../shared/data/wikitext-2 .devdata/
fi
# The data-efficiency section's corpus (Debian's linux-doc, scripts/corpus-linux-doc.sh; 5.6 MB):
# made once where Debian's archive is reachable, kept in .devdata/; without it the section trains
# on WikiText-2.
if [ -d .devdata ] && [ ! -e .devdata/linux-doc.tar.xz ]; then
  scripts/corpus-linux-doc.sh --out .devdata || echo "device-snapshot: no linux-doc corpus (the data_efficiency section uses WikiText-2)" >&2
fi
# DeepSpeed's published 7B loss logs, for the quality section's plot.
ds_logs=../shared/peers/deepspeed/examples/training/bf16_master_weight/logs/7b_loss_run
if [ -d .devdata ] && [ ! -d .devdata/deepspeed_bf16_logs ] && [ -d "$ds_logs" ]; then
  mkdir -p .devdata/deepspeed_bf16_logs && cp "$ds_logs"/*.csv .devdata/deepspeed_bf16_logs/
fi
rm -rf .snap && mkdir .snap
git archive HEAD | tar -x -C .snap
# The snapshot has no .git: gpu-check reads the commit from here (git there would name whatever
# checkout encloses .snap on the device).
git rev-parse --short HEAD >.snap/COMMIT
if [ -n "$against" ]; then
  rev=$(git rev-parse --verify -q "$against^{commit}") || { echo "device-snapshot: --against: no commit '$against'" >&2; exit 2; }
  mkdir .snap/against
  git archive "$rev" | tar -x -C .snap/against
  git rev-parse --short "$rev" >.snap/against/COMMIT
fi
cp -r .deps .snap/
[ -d .devdata ] && cp -r .devdata .snap/
# llm.c for the session's `llmc` section: run.sh and llmc/ of ../shared/peers (4 MB) as .peers/.
if [ -d ../shared/peers/llmc ]; then
  mkdir -p .snap/.peers && cp -r ../shared/peers/run.sh ../shared/peers/llmc .snap/.peers/
fi
# DeepSpeed's wheels (5 MB) for run.sh ds-python: the `moe` section's peer (DeepSpeed's MoE layer)
# and the `python` section's DeepNVMe comparison.
if [ -d ../shared/peers/deepspeed/wheels ]; then
  mkdir -p .snap/.peers/deepspeed && cp ../shared/peers/run.sh .snap/.peers/ && cp -r ../shared/peers/deepspeed/wheels .snap/.peers/deepspeed/
fi
du -sh .snap
