#!/usr/bin/env bash
# Prepared by scripts/device-snapshot.sh (run it from .snap/). One call on the lent GPU machine
# under a global deadline, so that a run cut short still returns what it measured. Steps, in the
# order they run (the default is all of them; --only picks some, --skip drops some):
#   check       build + every test (scripts/gpu-check.sh; TESTS=REGEX for a subset)
#   against     only with .snap/against/ (device-snapshot.sh --against REV): builds REV's tree and
#               runs the benchmarks of both builds (AGAINST_BENCH, default the kernel suites; REV's
#               rows filtered by AGAINST_OLD_FILTER), re-runs the rows more than AGAINST_THRESHOLD
#               percent slower (default 2) in AGAINST_ROUNDS - 1 more rounds (default 3 in all),
#               alternating which build runs first, then the table of this build against REV
#               (bench/compare_runs.py: the median over the rounds each row ran in). AGAINST_TARGETS:
#               build only these targets of REV; AGAINST_FILTER: only these rows in round 1 (a
#               filter no row of this build matches skips REV's build and says so, with some row
#               names: they start with the suite, e.g. attention_hopper/fwd/...)
#   comm_nccl   the communicator interface on NCCL (one rank: all-to-all, barrier, every
#               collective; test_comm_gpu) and the ZeRO world-size-1 tests that reach it through
#               parallel/ (test_zero_gpu ZeroWorldOne*)
#   comparison  the main job and its PyTorch peer (three layouts), the 6.86B model, the llm.c shape
#   real_data   prepare WikiText-2, train with validation (next-token, causal, --pad_vocab)
#   kernels     kernel benchmarks (BENCH_LIST, BENCH_FILTER; BENCH_LIMIT s each, default 60) and their PyTorch peers in the same
#               call (PEER_LIST, default all five), then the ratio table (KERNEL_ROUNDS=N: N rounds)
#   timing      --timing_report of the BF16 example's model and of GPT-2 d12 (the llmc section's recipe; also
#               with --attention_backward fast), each
#               followed by scripts/step_floor.py (its leaves against their floors)
#   ncu         ncu capture of exactly steps 3-4 (--profile_steps)
#   offload     the offload sweep, a large offload-bench, racecheck on a non-blocking round trip
#   io          io-bench (read/write/gpu), file-access and its Python peer, nvme-tune
#   checkpoints O_DIRECT write bandwidth (io-bench), then a 0.8B-parameter bf16_full run with
#               background saves (step time while a write is in flight against the others, the
#               write's GB/sec), sync saves and a cold --resume, and torch.save / torch.load of the
#               same tensors (bench/peers/checkpoint_peer.py) in the same call (CKPT_DIR, /tmp)
#   quality     the bf16 master's compensation: its GPU tests, the optimizer-step cost of the
#               compensated vs the plain bf16 master (bench_k3 adamw/*_comp, vs_plain), then
#               scripts/quality-run.sh (five layouts x 2 models x 1000 steps on WikiText-2 within
#               QUALITY_BUDGET s, default 240; QUALITY_MODELS=bf16_example or gpt2_small for one
#               model per call): the loss table and curves in logs/quality/
#   lamb        LAMB (kernels/lamb.cuh): its GPU tests, CPU tests and e2e, with the loss scaler's and
#               the dropout kernels' tests (ctest -R 'Lamb|lamb|LossScaler|Dropout|Philox'),
#               bench_lamb (the kernel pair on BERT-Large's tensors and on 4096 small ones, each
#               layout, RNE and SR: frac_copy_bw, vs_adam = its median over AdamW's on the same
#               buffers in the same call, bytes_vs_adam = what vs_adam is at equal bandwidth), and
#               bench_dropout (the Philox masks against copy bandwidth: frac_copy_bw), 8 steps of
#               configs/lamb.json on the BF16 example's model. About 3 minutes.
#   llmc        llm.c (PEERS_DIR, default .peers/: ../shared/peers' run.sh and llmc/) beside cutrain's
#               GPT-2 on the same WikiText-2 tokens: llm.c trains 30 steps from its d12 init and
#               writes its checkpoint; cutrain's validation loss of it against llm.c's; 200 steps
#               of the same recipe from it on both (configs/llmc_gpt2_constant.json = llm.c's
#               -l 3e-4 -u 0 -q 1.0 -c 0.1; --data_order llmc: llm.c's batches in llm.c's order,
#               its validation batches; docs/gpt2.md), cutrain's result read back by llm.c and by PyTorch
#               (bench/peers/gpt2_torch_eval.py on --save_hf's safetensors); d12 B16/B32
#               T1024 tokens/s and peak memory (scripts/peak-mem.sh) of both (cutrain with and without
#               --recompute_gelu); the table by
#               scripts/llmc_compare.py. About 6 minutes with llm.c's build. LLMC_FULL=0: the
#               throughput rows only (llm.c's build, then the B16/B32 runs), about 3 minutes.
#   moe         the MoE kernels' and layer's GPU tests (MOE_TESTS=0 leaves them to check), bench_moe (the layer at T8192 H1024 F4096, 8/64
#               experts, top-1/top-2, the slots and the packed rows; the grouped expert GEMM vs one
#               dense GEMM, vs a per-expert loop and vs the slots' strided batch) and bench/peers/moe_peer.py through PEERS_DIR's run.sh ds-python (DeepSpeed's MoE
#               layer at ep_size 1, a plain PyTorch MoE) in the same call, then the ratio table
#               (scripts/moe_table.py). About 4 minutes (DeepSpeed's install, no JIT op).
#   python      the Python package: the wheel built from build/gpu (scripts/build-wheel.sh, with
#               scikit-build-core / nanobind / pytest from .deps/wheels), installed into a folder of
#               its own; python/tests with PyTorch and CUDA; the 4 KiB call overhead against the C++
#               engine's (bench/python/python_overhead.py); then DeepNVMe's tutorial operations
#               through cutrain's handle and DeepSpeed's in the same process (bench/peers/
#               deepnvme_peer.py under PEERS_DIR's run.sh ds-python: the same checks on both, then
#               the GB/s table with ours/DeepSpeed per row; DNVME_DIR, default /tmp/dnvme;
#               DNVME_SIZE, default 1G; DNVME_REPS, default 8: each side on each of the two files
#               first and second twice, which 0.96x-0.97x rows need). About 8 minutes after the build.
#   moe_quality issue #22's training figures (scripts/moe_quality.py): dense, an 8-expert MoE in every
#               other block (top-MOEQ_TOPK, default 1: equal active FLOPs, at training capacity factor
#               MOEQ_CF, default 1.0; top-1 with random token selection unless MOEQ_RTS=false; gradient
#               clipping MOEQ_CLIP, default 0: none) and PR-MoE (pyramid + residual MLP) on the same shards
#               (.devdata/linux-doc.tar.xz when scripts/corpus-linux-doc.sh made it, 7.26M training tokens, else
#               WikiText-2), MOEQ_STEPS steps (default 600) of MOEQ_SHAPE (default bf16_example):
#               validation loss, parameters, step time and dropped routes, with the three verdicts;
#               then --timing_report of the BF16 example's dense and MoE steps (moe_timing_*.txt:
#               the MoE blocks' gate / permute / experts / unpermute rows, the optimizer's).
#               About 2 minutes at the defaults.
#   plan        the layout planner (cutrain plan): its GPU tests (PlannerGpu: predicted against the
#               allocator's peak; e2e_plan_cli_cuda: the profiled-run source), the 6.86B model on 4 GPUs
#               (baseline, bf16_full) from a profiled run on this GPU (4 of its 32 layers; the plan
#               prints that run's peak beside its prediction), then bf16_full from the whole model's
#               timing report (--kernel_timings). About 3 minutes (the 6.86B init on the host).
#   random_ltd  random-LTD: its GPU tests (test_token_drop_gpu, test_random_ltd_gpu,
#               e2e_random_ltd_cli_cuda), then scripts/random_ltd_bench.py: the step time at kept
#               fractions LTD_FRACTIONS (default 0.5,0.75) against the full-sequence step of the
#               same config, the BF16 example's model and GPT-2 small at seq 1024, every block or
#               DeepSpeed's 1..L-2 dropping, LTD_ROUNDS (default 3) alternating rounds, the table
#               against the target f + 0.08 and the ideal ratio from a timing report. About 5 minutes.
#   seqlen      the sequence-length curriculum: its GPU tests (test_seqlen_curriculum_gpu,
#               e2e_seqlen_curriculum_cli_cuda), then scripts/seqlen_bench.py: tokens/s at each
#               length of a ramp (seqlen_truncate, fixed_discrete over S/8, S/4, S/2, S) against a
#               fixed-length run at that length, GPT-2 small (8 x 1024) and the BF16 example's model
#               causal (4 x 512), SEQLEN_ROUNDS (default 3) alternating rounds, the table against the
#               target ratio >= 0.9. About 5 minutes.
#   parallel    issue #23 on one GPU: the pipeline's and tensor parallelism's GPU tests (PipelineGpu:
#               degree 1, virtual stages, tp 1 against the plain engine bit for bit; e2e_parallel_gpu_cli_cuda;
#               the CPU program and checkpoint-interval tests), then scripts/parallel_overhead_bench.py:
#               the step time of the plain engine, pp 1, tp 1, pp 1 + tp 1 and PAR_VIRTUAL (default 2,4)
#               virtual stages on configs/bf16_full.json's model (ZeRO 0) at gradient_accumulation_steps
#               PAR_ACCUM (default 1,8), PAR_ROUNDS (default 3) alternating rounds of PAR_STEPS (default
#               30) steps, the ratio table against the 1.03 target. About 6 minutes.
#   data_efficiency  issue #21's quality figures (scripts/data_efficiency_quality.py): baseline, the
#               vocabularyrarity curriculum, the seqlen warm-up (where its config is), random-LTD and
#               curriculum + random-LTD on the same shards (.devdata/linux-doc.tar.xz when
#               scripts/corpus-linux-doc.sh made it, else WikiText-2), DE_STEPS steps (default 1000) of
#               DE_SHAPE (default gpt2_small: B8 x S1024) within DE_BUDGET s (default 180): validation
#               loss against the steps' time and the wall clock, the table, the <= 0.8 verdict, SVG/PNG
#               in logs/data_efficiency/; then bench_token_drop and bench/peers/data_efficiency_peer.py
#               through PEERS_DIR's run.sh ds-python (DeepSpeed's CurriculumScheduler and
#               RandomLTDScheduler against every step of those runs, its random_ltd gather / scatter
#               op, a JIT build, against ours and PyTorch's index ops; DE_PEER=0 leaves it out). About 5
#               minutes: the runs ~3.5, DeepSpeed's install and JIT build ~1.5.
#   fp16_quality issue #20's fp16 numerics (scripts/fp16_quality.py): BERT (FP16Q_MODEL, default
#               BERT-Large) trained FP16Q_STEPS steps (default 300) at seq 128 x 64 on WikiText-2 in bf16
#               and in fp16 with dynamic loss scaling, same seed and batches: validation losses, the
#               fp16 run's overflows and loss scale, and the <= 1% verdict. About 1.5 minutes.
#   bert        issue #20's BERT-Large targets, cutrain and its PyTorch peer (bench/peers/bert_peer.py)
#               in the same call: the full training step at seq 128 x micro-batch 64 and seq 512 x 16
#               (samples/s, peak memory), one layer's forward+backward alone at both, and at seq 512
#               the largest micro-batch under BERT_MEM_CAP_GB (default 40). Peer variants BERT_DTYPES
#               (default fp16,bf16) x BERT_EXECS (default eager,compile; maxbatch: BERT_MAXBATCH_EXECS,
#               default eager; BERT_COMPILE_SCOPE=layers compiles each layer alone, a shorter compile).
#               cutrain's side: scripts/bert_bench.py (BERT_PARTS, default step,layer,flags,maxbatch;
#               the step in BERT_OURS_DTYPES, default bf16,fp16; within BERT_OURS_LIMIT s, default 300); BERT_PEER=0 leaves the peer out, BERT_PEER_MODES
#               (default step_s128,step_s512,layer,maxbatch) picks its runs.
#               About 15 minutes with every variant (the compiles dominate): --only bert, or fewer
#               variants, within one call's budget
#   large       issue #24's >= 1B GPT-style model (h 2048, 24 layers, T 2048, LARGE_BATCH default 8):
#               timing report (MFU, llm.c's count) and graph-replay step with peak memory,
#               LARGE_CONFIGS (default bf16_full baseline), each with the attention backward modes
#               LARGE_BACKWARDS (default deterministic; "deterministic fast" for both). About 2 minutes
#               per config and mode.
#   sanitize    compute-sanitizer memcheck, racecheck and synccheck on the sm90 attention pair's and
#               the cross-entropy kernel's tests (SAN_ATTN, SAN_CE: gtest filters; SAN_TOOLS, SAN_SUITES
#               narrow them). About 4 minutes.
#   extra       EXTRA_CMD, if set (e.g. a checkpoint benchmark), within EXTRA_LIMIT s (default 60);
#               its $OUT is this session's OUT: files it writes under $OUT/logs come back in logs.tar.gz
#   OUT=... scripts/device-session.sh [--budget SECONDS] [--only LIST] [--skip LIST]
# Logs go to $OUT/logs (tarred into $OUT/logs.tar.gz at the end: at most 8 files come back) and a
# summary to $OUT/summary.txt.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
budget=560; skip=""; only=""
while (($#)); do
  case "$1" in
    --budget) budget=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "device-session: unknown option $1" >&2; exit 2 ;;
  esac
done
export OUT=${OUT:-$root/build/device-session}
t_end=$(( $(date +%s) + budget ))
logs=$OUT/logs
mkdir -p "$logs"
sum=$OUT/summary.txt
left() { echo $(( t_end - $(date +%s) )); }
want() { # want SECTION: whether --only / --skip let it run
  [ -n "$only" ] && case ",$only," in *",$1,"*) ;; *) return 1 ;; esac
  case ",$skip," in *",$1,"*) return 1 ;; esac
  return 0
}
# step NAME LIMIT CMD...: runs CMD with min(LIMIT, time left - 15 s), logs to logs/NAME.txt
step() {
  local name=$1 limit=$2; shift 2
  local l; l=$(( $(left) - 15 )); (( l < limit )) && limit=$l
  if (( limit < 5 )); then echo "-- $name: no time left" >>"$sum"; return; fi
  local t0; t0=$(date +%s)
  timeout "$limit" bash -c "$*" >"$logs/$name.txt" 2>&1
  local rc=$?
  echo "-- $name: rc=$rc in $(( $(date +%s) - t0 )) s" >>"$sum"
}
bin=build/gpu/tools/cutrain
export CTEST_JOBS=${CTEST_JOBS:-12}
export CUTRAIN_DATA_DIR=$root/.devdata

# Build and tests (gpu-check keeps its own logs and summary under $OUT/check). Without `check`
# the build still runs (nothing else works without it), with no tests.
if want check; then
  OUT=$OUT/check scripts/gpu-check.sh --bench none ${TESTS:+--tests "$TESTS"} >"$logs/gpu-check.txt" 2>&1
else
  OUT=$OUT/check scripts/gpu-check.sh --bench none --tests '^$' >"$logs/gpu-check.txt" 2>&1
fi
echo "-- gpu-check rc=$? ($(( budget - $(left) )) s so far)" >>"$sum"
cat "$OUT/check/summary.txt" >>"$sum" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >>"$sum" 2>&1

# against_list [FILTER]: the rows of this build's benchmarks whose binary matches AGAINST_BENCH
# (under FILTER if given). A filter that lists none would spend REV's build and every round on
# empty runs.
against_list() {
  local b
  for b in build/gpu/bench/bench_*; do
    [ -x "$b" ] && basename "$b" | grep -qE -- "$against_bench" || continue
    "$b" --benchmark_list_tests ${1:+--benchmark_filter="$1"} 2>/dev/null
  done
}
against_bench=${AGAINST_BENCH:-attention|dense|k3|gemm}
if want against && [ -d against ] && [ "$(against_list "${AGAINST_FILTER:-}" | grep -c .)" = 0 ]; then
  echo "-- against: AGAINST_FILTER '${AGAINST_FILTER:-}' matches no row of this build's benchmarks matching AGAINST_BENCH '$against_bench' (row names look like: $(against_list | head -3 | tr '\n' ' ')); REV not built" >>"$sum"
elif want against && [ -d against ]; then
  # REV's tree, built as gpu-check builds this one (same prefix of unpacked .deps), tests off.
  gen=""; command -v ninja >/dev/null && gen="-G Ninja"
  step build_against 240 "cmake -S against -B build/against $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=/tmp/cutrain-deps/usr -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCUTRAIN_BUILD_TESTS=OFF && cmake --build build/against -j$(nproc) ${AGAINST_TARGETS:+--target $AGAINST_TARGETS}"
  export LD_LIBRARY_PATH=/tmp/cutrain-deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  mkdir -p "$logs/against"
  # bench_side SIDE ROUND [FILTER]: one bench-all run of this build (new) or REV's (old).
  bench_side() {
    local b=build/gpu c; c=$(cat COMMIT 2>/dev/null)
    [ "$1" = old ] && { b=build/against; c=$(cat against/COMMIT 2>/dev/null); }
    step against_$1_r$2 240 "scripts/bench-all.sh --build $b --commit '${c:-unknown}' --bench '$against_bench' ${3:+--filter '$3'} --out $logs/against/$1_r$2.json"
  }
  # Round 1: every benchmark of both builds (REV's filtered with AGAINST_OLD_FILTER, e.g. to
  # leave out rows this build no longer has). Then AGAINST_ROUNDS - 1 more rounds (default 2) of
  # only the rows round 1 flagged, alternating which build runs first.
  bench_side new 1 "${AGAINST_FILTER:-}"; bench_side old 1 "${AGAINST_OLD_FILTER:-${AGAINST_FILTER:-}}"
  olds=("$logs/against/old_r1.json"); news=("$logs/against/new_r1.json")
  flagged=$(python3 bench/compare_runs.py "${olds[0]}" "${news[0]}" --threshold "${AGAINST_THRESHOLD:-2}" --slower-filter 2>/dev/null)
  echo "-- against round 1 flagged: ${flagged:-none}" >>"$sum"
  if [ -n "$flagged" ]; then
    for ((r = 2; r <= ${AGAINST_ROUNDS:-3}; r++)); do
      if (( r % 2 )); then bench_side new $r "$flagged"; bench_side old $r "$flagged"
      else bench_side old $r "$flagged"; bench_side new $r "$flagged"; fi
      olds+=("$logs/against/old_r$r.json"); news+=("$logs/against/new_r$r.json")
    done
  fi
  ( IFS=,; python3 bench/compare_runs.py "${olds[*]}" "${news[*]}" --threshold "${AGAINST_THRESHOLD:-2}" \
      >"$logs/against.md" 2>&1 )
  echo "-- against $(cat against/COMMIT 2>/dev/null): rc=$? (A = that commit, B = $(cat COMMIT 2>/dev/null))" >>"$sum"
  cat "$logs/against.md" >>"$sum"
fi

if want comm_nccl; then
  step comm_nccl 150 "build/gpu/tests/test_comm_gpu && build/gpu/tests/test_zero_gpu --gtest_filter='ZeroWorldOne*'"
  grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) *\]" "$logs/comm_nccl.txt" | tail -40 >>"$sum" 2>/dev/null
fi

if want comparison; then
  step comparison 150 "OUT=$OUT/cmp PEER_MODES=eager scripts/run-comparison.sh --bin $bin --with-peer"
  tail -30 "$logs/comparison.txt" >>"$sum" 2>/dev/null
  step train_6p86b 150 "for c in baseline bf16_full; do $bin train --deepspeed_config configs/\$c.json --hidden_dim 4096 --num_layers 32 --num_heads 32 --batch_size 1 --seq_length 512 --activation_checkpointing --num_steps 4 --warmup_steps 1 --log_interval 1 | grep -E 'parameters|Memory after|Step|SUMMARY'; done"
  grep -E "SUMMARY|Model parameters" "$logs/train_6p86b.txt" >>"$sum" 2>/dev/null
  step train_llmc_shape 60 "$bin train --deepspeed_config configs/baseline.json --hidden_dim 768 --num_layers 12 --num_heads 12 --vocab_size 50257 --pad_vocab --attention causal --seq_length 1024 --batch_size 16 --num_steps 15 --warmup_steps 5 | tail -3"
  grep SUMMARY "$logs/train_llmc_shape.txt" >>"$sum" 2>/dev/null
fi

if want real_data; then
  # WikiText-2 valid + test as the corpus (train.txt is not in the shared data), 10% held out.
  step real_data 100 "$bin prepare-data --input .devdata/wikitext-2/valid.txt .devdata/wikitext-2/test.txt --vocab .devdata/gpt2/encoder.json --merges .devdata/gpt2/vocab.bpe --output /tmp/wt2 --val_fraction 0.1 && $bin train --deepspeed_config configs/bf16_full.json --use_real_data --data '/tmp/wt2_train_*.bin' --eval_data '/tmp/wt2_val_*.bin' --pad_vocab --num_steps 400 --log_interval 50 --eval_interval 50 --eval_steps 20 --learning_rate 3e-4 --loss_log_file $logs/real_data_loss.csv --metrics_file $logs/real_data_metrics.jsonl"
  grep -E "Objective|Dataset|Validation|Eval|SUMMARY" "$logs/real_data.txt" >>"$sum" 2>/dev/null
fi

if want kernels; then
  # Ours and the PyTorch peers in the same call: the ratio table compares like with like.
  # KERNEL_ROUNDS=N (default 1) repeats both sides N times, alternating which runs first, into
  # logs/roundK/; the table then shows every round's ratio (for shapes where the two sides call
  # the same library and differ by less than the run-to-run spread).
  run_ours() { # run_ours DIR SUFFIX
    local matched=0 ran=0
    for b in ${BENCH_LIST:-attention k3 dense offload gemm allocator}; do
      [ -x build/gpu/bench/bench_$b ] || continue
      local f=""
      [ -n "${BENCH_FILTER:-}" ] && f="--benchmark_filter='$BENCH_FILTER'"
      step bench_$b$2 ${BENCH_LIMIT:-60} "build/gpu/bench/bench_$b $f --benchmark_out=$1/bench_$b.json --benchmark_out_format=json --benchmark_counters_tabular=true"
      ran=$((ran + 1))
      # Google Benchmark exits 0 when the filter matches nothing in a binary; say so.
      if grep -q "Failed to match any benchmarks" "$logs/bench_$b$2.txt" 2>/dev/null; then
        echo "-- bench_$b$2: BENCH_FILTER matched no benchmark" >>"$sum"
      else
        matched=$((matched + 1))
      fi
    done
    if (( ran > 0 && matched == 0 )) && [ -n "${BENCH_FILTER:-}" ]; then
      echo "-- BENCH_FILTER matched no benchmark in any of: ${BENCH_LIST:-the default list} (names end in" \
        "/iterations:N/manual_time or /manual_time: end a name's pattern with '/', not '\$')" >>"$sum"
    fi
  }
  run_peers() { # run_peers DIR SUFFIX
    for p in ${PEER_LIST:-attention dense k3 offload gemm}; do
      [ -e bench/peers/${p}_peer.py ] && step peer_$p$2 60 "python3 bench/peers/${p}_peer.py --out $1/${p}_peer.json"
    done
  }
  rounds=${KERNEL_ROUNDS:-1}
  if (( rounds > 1 )); then
    for ((r = 1; r <= rounds; r++)); do
      mkdir -p "$logs/round$r"
      if (( r % 2 )); then run_ours "$logs/round$r" _r$r; run_peers "$logs/round$r" _r$r
      else run_peers "$logs/round$r" _r$r; run_ours "$logs/round$r" _r$r; fi
    done
    python3 bench/peers/compare.py --rounds "$logs"/round* >"$logs/compare.md" 2>&1
  else
    run_ours "$logs" ""
    run_peers "$logs" ""
    python3 bench/peers/compare.py --ours "$logs"/bench_*.json --peers "$logs"/*_peer.json >"$logs/compare.md" 2>&1
  fi
  cat "$logs/compare.md" >>"$sum"
fi
if want timing; then
  step timing_report 60 "$bin train --deepspeed_config configs/bf16_full.json --num_steps 8 --timing_report $logs/timing_report.json"
  sed -n '/SUMMARY/,$p' "$logs/timing_report.txt" | tail -60 >>"$sum" 2>/dev/null
  python3 scripts/step_floor.py "$logs/timing_report.json" >>"$sum" 2>&1
  # GPT-2 124M as the llmc section runs it against llm.c (d12, T 1024, B 16, llm.c's recipe), where
  # the time goes (random tokens: the step's kernels are the same).
  # Both attention backwards: deterministic (the default) and fast (one pass, dQ by reduce-adds).
  for mode in deterministic fast; do
    n=timing_llmc; [ $mode = fast ] && n=timing_llmc_fast
    step $n 60 "$bin train --deepspeed_config configs/llmc_gpt2_constant.json -e d12 --seq_length 1024 --batch_size 16 --num_steps 10 --warmup_steps 4 --attention_backward $mode --timing_report $logs/$n.json"
    sed -n '/SUMMARY/,$p' "$logs/$n.txt" | tail -40 >>"$sum" 2>/dev/null
    python3 scripts/step_floor.py "$logs/$n.json" >>"$sum" 2>&1
  done
fi

if want ncu; then
  # Exactly steps 3 and 4 of the BF16 example's model (eager inside the window).
  # About 0.3 s per launch under ncu: two whole steps (~560 launches) need ~4 minutes.
  step ncu 280 "ncu --clock-control none --profile-from-start off --section SpeedOfLight --csv $root/$bin train --deepspeed_config configs/bf16_full.json --num_steps 5 --profile_steps 3:4 > $logs/ncu.csv; rc=\$?; wc -l $logs/ncu.csv; python3 scripts/ncu_summary.py $logs/ncu.csv; exit \$rc"
  tail -40 "$logs/ncu.txt" >>"$sum" 2>/dev/null
fi

if want offload; then
  step offload_sweep 90 "scripts/offload-sweep.sh --trials 2 --cutrain $bin -- --hidden_dim 16384 --nlayers 1; $bin offload-bench --hidden_dim 16384 --nlayers 4 --pin_memory --iteration 3 --warmup 1 | tail -8; $bin offload-bench --hidden_dim 16384 --nlayers 4 --iteration 2 --warmup 1 | tail -4"
  tail -30 "$logs/offload_sweep.txt" >>"$sum" 2>/dev/null
  step offload_racecheck 60 "compute-sanitizer --tool racecheck --racecheck-report all $bin offload-bench --hidden_dim 1024 --nlayers 1 --pin_memory --non_blocking --iteration 2 --warmup 1 | tail -8; compute-sanitizer --tool memcheck $bin offload-bench --hidden_dim 1024 --nlayers 1 --pin_memory --non_blocking --iteration 2 --warmup 1 | tail -4"
  tail -14 "$logs/offload_racecheck.txt" >>"$sum" 2>/dev/null
fi

if want io; then
  step io 130 "mkdir -p /tmp/io && $bin io-bench --folder /tmp/io --io_size 1G --read --loops 3 && $bin io-bench --folder /tmp/io --io_size 1G --loops 3 && $bin io-bench --folder /tmp/io --io_size 1G --read --gpu --loops 3 --no_baselines && $bin file-access --folder /tmp/io --size 1G && python3 bench/peers/file_access_peer.py --folder /tmp/io --out $logs/file_access_peer.json && $bin nvme-tune --folder /tmp/io --io_size 256M --io_parallel 1 4"
  grep -E "Speed|GB/s|best|aio|backend|tensor" "$logs/io.txt" | tail -50 >>"$sum" 2>/dev/null
fi

if want checkpoints; then
  ck=${CKPT_DIR:-/tmp/cutrain_ck}
  rm -rf "$ck"; mkdir -p "$ck"
  big=(--hidden_dim 2048 --num_layers 12 --num_heads 16 --batch_size 16 --seq_length 512 --warmup_steps 5
       --log_interval 50)
  # The aio block at 4 workers per transfer (ds_nvme_tune's best write here) for the p4 runs.
  python3 -c "import json; c = json.load(open('configs/bf16_full.json')); c['aio'] = {'intra_op_parallelism': 4}; json.dump(c, open('$ck/bf16_full_p4.json', 'w'))"
  # CKPT_FULL=0: one io-bench, no async run, no p4 runs (a shorter call).
  full=${CKPT_FULL:-1}
  p4cmd="&& $bin io-bench --folder $ck/io --io_size 4G --loops 2 --io_parallel 4 --no_baselines"
  [ "$full" = 1 ] || p4cmd=""
  step ckpt_io 90 "mkdir -p $ck/io && $bin io-bench --folder $ck/io --io_size 4G --loops 2 $p4cmd; rm -rf $ck/io"
  grep -E "GB/sec|O_DIRECT|buffered" "$logs/ckpt_io.txt" | tail -12 >>"$sum" 2>/dev/null
  [ "$full" = 1 ] && step ckpt_async 120 "$bin train --deepspeed_config configs/bf16_full.json ${big[*]} --num_steps 240 --save $ck/async --save_interval 80 --keep_last 1 --save_mode async"
  grep -E "checkpoint:|Steps during|Average step" "$logs/ckpt_async.txt" | tail -12 >>"$sum" 2>/dev/null
  rm -rf "$ck/async"
  parts=p1; [ "$full" = 1 ] && parts="p1 p4"
  for p in $parts; do
    cfg=configs/bf16_full.json; [ $p = p4 ] && cfg=$ck/bf16_full_p4.json
    step ckpt_sync_$p 120 "$bin train --deepspeed_config $cfg ${big[*]} --num_steps 30 --save $ck/sync_$p --save_interval 10 --keep_last 1 --save_mode sync && for r in 1 2; do python3 bench/peers/checkpoint_peer.py --drop_cache $ck/sync_$p && $bin train --deepspeed_config $cfg ${big[*]} --num_steps 1 --resume $ck/sync_$p || exit 1; done"
    grep -E "checkpoint:" "$logs/ckpt_sync_$p.txt" | tail -8 >>"$sum" 2>/dev/null
  done
  step ckpt_peer 120 "python3 bench/peers/checkpoint_peer.py --like $ck/sync_p1/global_step30 --dir $ck/peer --reps 3 --cutrain_log $logs/ckpt_sync_p1.txt --out $logs/checkpoint_peer.json"
  tail -9 "$logs/ckpt_peer.txt" >>"$sum" 2>/dev/null
  rm -rf "$ck"
fi

if want quality; then
  # About 4 minutes: tests ~40 s, the benchmark ~30 s, the runs ~150 s (the BF16 example's model
  # ~9 ms a step, GPT-2 small at batch 4 x 512 ~5 ms, plus start-up and validation).
  [ "${QUALITY_TESTS:-1}" = 1 ] && step quality_tests 90 "ctest --test-dir build/gpu -j $CTEST_JOBS --output-on-failure -R 'Compensat|_comp|e2e_quality_run_cli'"
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$logs/quality_tests.txt" | tail -15 >>"$sum" 2>/dev/null
  step quality_bench 60 "build/gpu/bench/bench_k3 --benchmark_filter='adamw/bf16_(master_wg|full)(_comp)?/' --benchmark_out=$logs/bench_k3_comp.json --benchmark_out_format=json --benchmark_counters_tabular=true"
  qb=${QUALITY_BUDGET:-240}
  step quality_run $((qb + 30)) "scripts/quality-run.sh --bin $bin --data .devdata --budget $qb ${QUALITY_MODELS:+--models $QUALITY_MODELS} --bench_json $logs/bench_k3_comp.json --out $logs/quality; rc=\$?; rm -rf $logs/quality/data; exit \$rc"
  sed -n '/^## BF16 master weights/,$p' "$logs/quality_run.txt" | grep -v "^quality-run:" >>"$sum" 2>/dev/null
fi

if want lamb; then
  step lamb_tests 150 "ctest --test-dir build/gpu -j $CTEST_JOBS --output-on-failure -R 'Lamb|lamb|LossScaler|Dropout|Philox'"
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$logs/lamb_tests.txt" | tail -15 >>"$sum" 2>/dev/null
  step lamb_bench 120 "build/gpu/bench/bench_lamb --benchmark_out=$logs/bench_lamb.json --benchmark_out_format=json --benchmark_counters_tabular=true"
  python3 - "$logs/bench_lamb.json" >>"$sum" 2>&1 <<'PY'
import json, sys
print("lamb bench: row, median us, frac_copy_bw, vs_adam (bytes_vs_adam: the equal-bandwidth ratio)")
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if "vs_adam" in b:
        print(f"  {b['name']:36s} {b['median_us']:9.1f} {b['frac_copy_bw']:6.3f} {b['vs_adam']:6.3f} ({b['bytes_vs_adam']:.3f})")
PY
  step dropout_bench 60 "build/gpu/bench/bench_dropout --benchmark_out=$logs/bench_dropout.json --benchmark_out_format=json --benchmark_counters_tabular=true"
  python3 - "$logs/bench_dropout.json" >>"$sum" 2>&1 <<'PY'
import json, sys
print("dropout bench: row, median us, frac_copy_bw")
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if "frac_copy_bw" in b:
        print(f"  {b['name']:44s} {b['median_us']:9.1f} {b['frac_copy_bw']:6.3f}")
PY
  step lamb_train 60 "$bin train --deepspeed_config configs/lamb.json --num_steps 8 --warmup_steps 2 --log_interval 1 | grep -E 'layout|Step|SUMMARY'"
  grep -E "Step 7|SUMMARY" "$logs/lamb_train.txt" | sed 's/^/lamb train: /' >>"$sum" 2>/dev/null
fi

if want llmc; then
  peers=${PEERS_DIR:-$root/.peers}
  lc=/tmp/llmc  # run.sh builds train_gpt2cu and writes train.bin / val.bin (WikiText-2 valid / test) here
  ck=$lc/ck/model_00000030.bin
  lenv='cud=$(python3 -c "import nvidia.cudnn as m; print(list(m.__path__)[0])"); export LD_LIBRARY_PATH=$cud/lib:${LD_LIBRARY_PATH:-}; cd '$lc
  lbin="./train_gpt2cu -i $lc/train.bin -j $lc/val.bin -t 1024 -m 8 -s 100000 -l 3e-4 -u 0 -q 1.0 -c 0.1"
  cfg=configs/llmc_gpt2_constant.json
  # llm.c's DataLoader order (the config says it too): the same batches as train_gpt2cu's, seed 42.
  cdata="--use_real_data --data $lc/train.bin --eval_data $lc/val.bin --eval_steps 8 --seq_length 1024 --data_order llmc --seed 42"
  if [ -x "$peers/run.sh" ]; then
    step llmc_build 240 "$peers/run.sh llmc-gpt2 16 1"
    full=${LLMC_FULL:-1}  # LLMC_FULL=0: the throughput rows only (no parity, 200-step runs, round trips)
    if [ "$full" = 1 ]; then
      step llmc_train 90 "$lenv && $lbin -e d12 -b 16 -x 30 -v 1000 -n 30 -o $lc/ck && ls -l $ck"
      step llmc_parity 90 "$bin train --deepspeed_config $cfg --init_from_llmc $ck $cdata --batch_size 16 --num_steps 1"
      step llmc_200 90 "$lenv && $lbin -e $ck -b 16 -x 200 -v 1000"
      step cutrain_200 150 "$bin train --deepspeed_config $cfg --init_from_llmc $ck $cdata --batch_size 16 --num_steps 200 --log_interval 1 --save_llmc $lc/cutrain_200.bin --save_hf $lc/cutrain_200.safetensors"
    fi
    # Throughput: llm.c first at B16, last at B32 (neither always runs on a warmer GPU); cutrain
    # with and without --recompute_gelu (llm.c's -r 1, its default), and with the fast
    # (non-deterministic) attention backward, as cuDNN's in llm.c.
    for b in 16 32; do
      crun="scripts/peak-mem.sh $logs/cutrain_speed_b$b.mem $bin train --deepspeed_config $cfg -e d12 $cdata --batch_size $b --num_steps 30 --warmup_steps 10"
      rrun="scripts/peak-mem.sh $logs/cutrain_speed_r_b$b.mem $bin train --deepspeed_config $cfg -e d12 $cdata --batch_size $b --num_steps 30 --warmup_steps 10 --recompute_gelu"
      frun="scripts/peak-mem.sh $logs/cutrain_speed_f_b$b.mem $bin train --deepspeed_config $cfg -e d12 $cdata --batch_size $b --num_steps 30 --warmup_steps 10 --attention_backward fast"
      [ $b = 16 ] && step llmc_speed_b$b 90 "$lenv && $root/scripts/peak-mem.sh $logs/llmc_speed_b$b.mem $lbin -e d12 -b $b -x 30 -v 100000"
      step cutrain_speed_b$b 120 "$crun"
      step cutrain_speed_r_b$b 120 "$rrun"
      step cutrain_speed_f_b$b 120 "$frun"
      [ $b = 32 ] && step llmc_speed_b$b 90 "$lenv && $root/scripts/peak-mem.sh $logs/llmc_speed_b$b.mem $lbin -e d12 -b $b -x 30 -v 100000"
    done
    # The round trips last (the targets above come first when time is short).
    if [ "$full" = 1 ]; then
      step torch_eval 60 "python3 bench/peers/gpt2_torch_eval.py --weights $lc/cutrain_200.safetensors --tokens $lc/val.bin --heads 12 --batch 16 --seq 1024 --batches 8"
      step llmc_back 60 "$lenv && $lbin -e $lc/cutrain_200.bin -b 16 -x 1 -v 1000"
      grep -m1 "Data order" "$logs/cutrain_200.txt" | sed 's/^/cutrain_200: /' >>"$sum"
    fi
    python3 scripts/llmc_compare.py --logs "$logs" >>"$sum" 2>&1
    if [ "$full" = 1 ]; then
      grep -E "^val loss" "$logs/llmc_back.txt" | head -1 | sed 's/^/llm.c reading cutrain_200.bin (step 0): /' >>"$sum"
      grep -E "Eval after" "$logs/cutrain_200.txt" | tail -1 | sed 's/^/cutrain before writing it: /' >>"$sum"
      grep -E "^torch val loss" "$logs/torch_eval.txt" | sed 's/^/PyTorch on cutrain_200.safetensors: /' >>"$sum"
    fi
  else
    echo "-- llmc: no $peers/run.sh (carry ../shared/peers as .peers, or set PEERS_DIR)" >>"$sum"
  fi
fi

if want moe; then
  peers=${PEERS_DIR:-$root/.peers}
  if [ "${MOE_TESTS:-1}" != 0 ]; then
    step moe_tests 180 "ctest --test-dir build/gpu -j 4 --output-on-failure -R '^Moe|/MoeModelGpu|^GemmGpu|^MosGpu|test_moe'"
    grep -E "tests passed|FAILED|Failed|GroupedGemm fallback" "$logs/moe_tests.txt" >>"$sum" 2>/dev/null
  fi
  step bench_moe 200 "build/gpu/bench/bench_moe --benchmark_out=$logs/bench_moe.json --benchmark_out_format=json --benchmark_counters_tabular=true"
  if [ -x "$peers/run.sh" ]; then
    step peer_moe 240 "$peers/run.sh ds-python $root/bench/peers/moe_peer.py --out $logs/moe_peer.json"
  else
    echo "-- moe: no $peers/run.sh (carry ../shared/peers as .peers, or set PEERS_DIR): plain PyTorch peer only" >>"$sum"
    step peer_moe 120 "python3 bench/peers/moe_peer.py --out $logs/moe_peer.json"
  fi
  python3 scripts/moe_table.py --ours "$logs/bench_moe.json" --peer "$logs/moe_peer.json" >"$logs/moe_table.md" 2>&1
  cat "$logs/moe_table.md" >>"$sum"
fi

if want moe_quality; then
  corpus=""; [ -e .devdata/linux-doc.tar.xz ] && corpus="--corpus .devdata/linux-doc.tar.xz"
  # ~10-16 ms a step on the H100 for the three variants, plus start-up, evaluation and the corpus's
  # tokenization (~10 s): the limit grows with MOEQ_STEPS (3000: ~0.85 of the corpus's 7.26M tokens).
  step moe_quality $(( 300 + ${MOEQ_STEPS:-600} / 20 )) "python3 scripts/moe_quality.py --bin $bin --shape ${MOEQ_SHAPE:-bf16_example} --steps ${MOEQ_STEPS:-600} --top_k ${MOEQ_TOPK:-1} --capacity_factor ${MOEQ_CF:-1.0} --gradient_clipping ${MOEQ_CLIP:-0} ${MOEQ_RTS:+--use_rts $MOEQ_RTS} --data .devdata $corpus --out $logs/moe_quality"
  rm -rf "$logs/moe_quality/data"  # the shards and the extracted corpus do not come back
  grep -E "^\||^- |^## " "$logs/moe_quality.txt" >>"$sum" 2>/dev/null
  # Where the MoE step's time goes: --timing_report of the BF16 example's dense model and its MoE
  # variant (synthetic tokens, the quality run's config; the timed steps run eagerly).
  moeq_shape="--deepspeed_config configs/baseline.json --hidden_dim 1024 --num_layers 12 --num_heads 16 --batch_size 4 --seq_length 512 --num_steps 12 --warmup_steps 4"
  step moe_timing 120 "$bin train $moeq_shape --timing_report $logs/moe_timing_dense.json >$logs/moe_timing_dense.txt 2>&1 && $bin train $moeq_shape --num_experts 8 --expert_interval 2 --top_k 1 --timing_report $logs/moe_timing_moe.json >$logs/moe_timing_moe.txt 2>&1"
  for v in dense moe; do
    echo "-- moe_timing $v:" >>"$sum"
    grep -E "^ *(step|step/fwd|step/bwd|step/optimizer|step/grad_norm)\b|moe" "$logs/moe_timing_$v.txt" | head -40 >>"$sum" 2>/dev/null
  done
fi

if want fp16_quality; then
  step fp16_quality ${FP16Q_LIMIT:-240} "python3 scripts/fp16_quality.py --bin $bin --data .devdata --steps ${FP16Q_STEPS:-300} --bert_config ${FP16Q_MODEL:-configs/bert_large.json} --json $logs/fp16_quality.json"
  grep -E "^  (bf16|fp16):|^fp16 vs|fp16_quality:" "$logs/fp16_quality.txt" >>"$sum" 2>/dev/null
fi

if want python; then
  pyd=/tmp/cutrain-python
  rm -rf "$pyd"; mkdir -p "$pyd"
  step python_wheel 300 "python3 -m pip install -q --no-index --find-links .deps/wheels --target $pyd/build-deps scikit-build-core nanobind pytest && PYTHONPATH=$pyd/build-deps scripts/build-wheel.sh --build-dir build/gpu --out $pyd/dist && python3 -m pip install -q --no-deps --no-index --target $pyd/site $pyd/dist/cutrain-*.whl && ls $pyd/dist"
  tail -3 "$logs/python_wheel.txt" >>"$sum" 2>/dev/null
  pyenv="PYTHONPATH=$pyd/site:$pyd/build-deps"
  step python_tests 240 "cd /tmp && $pyenv python3 -m pytest -q -rs -p no:cacheprovider $root/python/tests"
  grep -E "passed|failed|SKIPPED|Error" "$logs/python_tests.txt" | tail -12 >>"$sum" 2>/dev/null
  step python_overhead 150 "for d in /tmp /dev/shm; do for t in numpy torch; do $pyenv python3 bench/python/python_overhead.py --folder \$d/cutrain_ov \$([ \$t = torch ] && echo --torch) --out $logs/python_overhead_\${t}_\$(basename \$d).json || exit 1; done; done"
  grep -vE "^\s*$" "$logs/python_overhead.txt" | tail -32 >>"$sum" 2>/dev/null
  peers=${PEERS_DIR:-$root/.peers}
  if [ -x "$peers/run.sh" ]; then
    # DeepSpeed's async_io op finds libaio through CFLAGS / LDFLAGS (its compatibility probe) and
    # CPATH / LIBRARY_PATH (the JIT build): gpu-check unpacked .deps' libaio-dev there.
    dsaio=/tmp/cutrain-deps/usr
    aioenv="CFLAGS=-I$dsaio/include LDFLAGS=-L$dsaio/lib/x86_64-linux-gnu CPATH=$dsaio/include LIBRARY_PATH=$dsaio/lib/x86_64-linux-gnu LD_LIBRARY_PATH=$dsaio/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    step python_deepnvme 600 "$pyenv $aioenv $peers/run.sh ds-python bench/peers/deepnvme_peer.py --folder ${DNVME_DIR:-/tmp/dnvme} --size ${DNVME_SIZE:-1G} --reps ${DNVME_REPS:-8} --out $logs/deepnvme_peer.json; rc=\$?; rm -rf ${DNVME_DIR:-/tmp/dnvme}; exit \$rc"
    grep -E "^check|FAILED|^\||^target|^bench" "$logs/python_deepnvme.txt" >>"$sum" 2>/dev/null
  else
    echo "-- python_deepnvme: no $peers/run.sh (device-snapshot.sh copies ../shared/peers as .peers, or set PEERS_DIR)" >>"$sum"
  fi
fi

if want plan; then
  big="--hidden_dim 4096 --num_layers 32 --num_heads 32 --batch_size 1 --seq_length 512 --activation_checkpointing"
  step plan_tests 150 "ctest --test-dir build/gpu -j 1 --output-on-failure -R 'PlannerGpu|e2e_plan_cli_cuda'"
  step plan_6p86b 120 "for c in baseline bf16_full; do $bin plan --deepspeed_config configs/\$c.json $big --num_gpus 4 || exit 1; done"
  step plan_6p86b_report 180 "$bin train --deepspeed_config configs/bf16_full.json $big --num_steps 6 --warmup_steps 2 --timing_steps 3 --timing_report $logs/timing_6p86b.json | tail -4 && $bin plan --deepspeed_config configs/bf16_full.json $big --num_gpus 4 --kernel_timings $logs/timing_6p86b.json"
  grep -hE "memory check|^\| zero3|kernel timings" "$logs/plan_6p86b.txt" "$logs/plan_6p86b_report.txt" >>"$sum" 2>/dev/null
fi

if want random_ltd; then
  step random_ltd_tests 150 "ctest --test-dir build/gpu -j $CTEST_JOBS --output-on-failure -R 'TokenDropGpu|RandomLtdGpu|e2e_random_ltd_cli_cuda'"
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$logs/random_ltd_tests.txt" | tail -15 >>"$sum" 2>/dev/null
  step random_ltd_bench 300 "python3 scripts/random_ltd_bench.py --bin $bin --fractions ${LTD_FRACTIONS:-0.5,0.75} --rounds ${LTD_ROUNDS:-3} --out $logs/random_ltd"
  grep -E "^\|" "$logs/random_ltd_bench.txt" >>"$sum" 2>/dev/null
fi

if want seqlen; then
  step seqlen_tests 150 "ctest --test-dir build/gpu -j $CTEST_JOBS --output-on-failure -R 'SeqlenGpu|e2e_seqlen_curriculum_cli_cuda'"
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$logs/seqlen_tests.txt" | tail -15 >>"$sum" 2>/dev/null
  step seqlen_bench 300 "python3 scripts/seqlen_bench.py --bin $bin --rounds ${SEQLEN_ROUNDS:-3} --out $logs/seqlen"
  grep -E "^\|" "$logs/seqlen_bench.txt" >>"$sum" 2>/dev/null
fi

if want parallel; then
  step parallel_tests 240 "ctest --test-dir build/gpu -j 1 --output-on-failure -R 'PipelineGpu|e2e_parallel_gpu_cli|PipelineProgram|VirtualStagesReference|e2e_pipeline_host_cli_cpu'"
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$logs/parallel_tests.txt" | tail -15 >>"$sum" 2>/dev/null
  step parallel_bench 420 "python3 scripts/parallel_overhead_bench.py --bin $bin --rounds ${PAR_ROUNDS:-3} --steps ${PAR_STEPS:-30} --warmup 8 --accum ${PAR_ACCUM:-1,8} --virtual ${PAR_VIRTUAL:-2,4} --out $logs/parallel"
  grep -E "^\|" "$logs/parallel_bench.txt" >>"$sum" 2>/dev/null
fi

if want data_efficiency; then
  # gpt2_small at B8 x S1024 is ~18-22 ms a step (docs/perf-notes.md: d12 B16 T1024 33.9 ms): 1000
  # steps ~20 s a variant, plus start-up, validation and the random-LTD / seqlen recaptures.
  corpus=""; [ -e .devdata/linux-doc.tar.xz ] && corpus="--corpus .devdata/linux-doc.tar.xz"
  de_b=${DE_BUDGET:-180}
  step data_efficiency $((de_b + 40)) "python3 scripts/data_efficiency_quality.py --bin $bin --shape ${DE_SHAPE:-gpt2_small} --steps ${DE_STEPS:-1000} --data .devdata $corpus --budget $de_b --out $logs/data_efficiency"
  # The shards and the extracted corpus (~70 MB) do not come back; a run cut by the limit still gets its
  # report from what the runs wrote (an unfinished variant is marked).
  rm -rf "$logs/data_efficiency/data"
  [ -e "$logs/data_efficiency/data_efficiency.md" ] || [ ! -e "$logs/data_efficiency/meta.json" ] || \
    python3 scripts/data_efficiency_quality.py --report "$logs/data_efficiency" >>"$logs/data_efficiency.txt" 2>&1
  sed -n '/^## Data efficiency/,/^Curves/p' "$logs/data_efficiency.txt" | grep -v '^$' >>"$sum" 2>/dev/null
  step bench_token_drop 60 "build/gpu/bench/bench_token_drop --benchmark_out=$logs/bench_token_drop.json --benchmark_out_format=json --benchmark_counters_tabular=true"
  peers=${PEERS_DIR:-$root/.peers}
  if [ "${DE_PEER:-1}" = 0 ]; then
    echo "-- data_efficiency: DE_PEER=0, no DeepSpeed peer" >>"$sum"
  elif [ -x "$peers/run.sh" ]; then
    step peer_data_efficiency 240 "$peers/run.sh ds-python bench/peers/data_efficiency_peer.py --results $logs/data_efficiency --out $logs/data_efficiency_peer.json"
    grep -E "^\||^schedules|^DeepSpeed" "$logs/peer_data_efficiency.txt" >>"$sum" 2>/dev/null
    python3 bench/peers/compare.py --ours "$logs/bench_token_drop.json" --peers "$logs/data_efficiency_peer.json" >>"$sum" 2>&1
  else
    echo "-- data_efficiency: no $peers/run.sh (carry ../shared/peers as .peers, or set PEERS_DIR): no DeepSpeed peer" >>"$sum"
  fi
fi

if want bert; then
  cap=${BERT_MEM_CAP_GB:-40}
  peer="python3 bench/peers/bert_peer.py --dtype ${BERT_DTYPES:-fp16,bf16}"
  # ---- cutrain's side (scripts/bert_bench.py): the step at both shapes, one layer inside the step
  # (timing report), the memory flags at seq 512, the largest micro-batch under the cap ----
  step bert_cutrain ${BERT_OURS_LIMIT:-300} "python3 scripts/bert_bench.py --bin $bin --parts ${BERT_PARTS:-step,layer,flags,maxbatch} --dtypes ${BERT_OURS_DTYPES:-bf16,fp16} --mem_cap_gb $cap --json $logs/bert_ours.json"
  grep -hE "^\||^maxbatch|^  (run|layer|maxbatch)" "$logs/bert_cutrain.txt" >>"$sum" 2>/dev/null
  # ---- the PyTorch peer (BERT_PEER=0: not run): a table line per variant in each log, JSON beside it ----
  [ "${BERT_PEER:-1}" = 0 ] || {
  pv="--exec ${BERT_EXECS:-eager,compile} --compile_scope ${BERT_COMPILE_SCOPE:-model}"
  modes=",${BERT_PEER_MODES:-step_s128,step_s512,layer,maxbatch},"
  [[ $modes == *,step_s128,* ]] && step bert_peer_step_s128 300 "$peer $pv --mode step --seq 128 --batch 64 --json $logs/bert_peer_step_s128.json"
  [[ $modes == *,step_s512,* ]] && step bert_peer_step_s512 300 "$peer $pv --mode step --seq 512 --batch 16 --json $logs/bert_peer_step_s512.json"
  [[ $modes == *,layer,* ]] && step bert_peer_layer 240 "$peer $pv --mode layer --seq 128 --batch 64 --json $logs/bert_peer_layer_s128.json; $peer $pv --mode layer --seq 512 --batch 16 --json $logs/bert_peer_layer_s512.json"
  [[ $modes == *,maxbatch,* ]] && step bert_peer_maxbatch 240 "$peer --exec ${BERT_MAXBATCH_EXECS:-eager} --mode maxbatch --seq 512 --mem_cap_gb $cap --json $logs/bert_peer_maxbatch.json"
  for f in step_s128 step_s512 layer maxbatch; do
    grep -hE "^bert/|failed" "$logs/bert_peer_$f.txt" 2>/dev/null | sed 's/^/bert peer: /' >>"$sum"
  done
  grep -h "^optimizer:" "$logs/bert_peer_step_s128.txt" 2>/dev/null | head -1 | sed 's/^/bert peer: /' >>"$sum"
  }
fi

if want large; then
  # Issue #24's >= 1B GPT-style model at T 2048: GPT-2's architecture (pre-LN, tied head, causal)
  # at h 2048, 24 layers, 16 heads (1.31B parameters with the padded vocabulary), bf16_full and
  # baseline, LARGE_BATCH (default 8) x 2048 tokens; the timing report's MFU counts llm.c's
  # 6N + 6LTC per token. Then the step under graph replay (the report's steps run eagerly).
  lg="--model gpt2 --hidden_dim 2048 --num_layers 24 --num_heads 16 --vocab_size 50257 --pad_vocab --seq_length 2048 --batch_size ${LARGE_BATCH:-8}"
  # LARGE_BACKWARDS (default deterministic): the attention backward modes to run each config in.
  for c in ${LARGE_CONFIGS:-bf16_full baseline}; do
    for ab in ${LARGE_BACKWARDS:-deterministic}; do
      n=${c}_$ab
      step large_timing_$n 120 "$bin train --deepspeed_config configs/$c.json $lg --attention_backward $ab --num_steps 8 --warmup_steps 3 --timing_report $logs/large_timing_$n.json"
      sed -n '/SUMMARY/,$p' "$logs/large_timing_$n.txt" | tail -50 >>"$sum" 2>/dev/null
      python3 scripts/step_floor.py "$logs/large_timing_$n.json" >>"$sum" 2>&1
      step large_graph_$n 120 "scripts/peak-mem.sh $logs/large_graph_$n.mem $bin train --deepspeed_config configs/$c.json $lg --attention_backward $ab --num_steps 15 --warmup_steps 5 | grep -E 'parameters|SUMMARY|Average|Mean step'"
      { grep -E "parameters|SUMMARY|Average|Mean step" "$logs/large_graph_$n.txt"; cat "$logs/large_graph_$n.mem"; } 2>/dev/null | sed "s/^/large $n: /" >>"$sum"
    done
  done
fi

if want sanitize; then
  # compute-sanitizer on issue #24's kernels: memcheck, racecheck (shared-memory hazards) and
  # synccheck (barrier misuse) on the sm90 attention pair's odd-shape tests and the cross-entropy
  # tests. SAN_ATTN / SAN_CE: gtest filters (small shapes: every launch runs instrumented);
  # SAN_TOOLS (default all three) and SAN_SUITES (default "attention ce") narrow a short call.
  t=build/gpu/tests
  fa=${SAN_ATTN:-'OddShapes/AttentionHopperGpu.*S129D64_causal:OddShapes/AttentionHopperGpu.*S200D128_full:OddShapes/AttentionHopperBwdGpu.*S129*:Masked/AttentionHopperOptionsGpu.*'}
  fc=${SAN_CE:-'*-*/2048x*:*/64x262144*'}  # the 2048-row and 64x262144 shapes take minutes instrumented
  suites=${SAN_SUITES:-attention ce}
  for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
    case " $suites " in *" attention "*)
      # Each binary only where the filter names some of its tests (compute-sanitizer fails a run
      # that launches nothing).
      cmds=""
      for b in test_attention_hopper_gpu test_attention_hopper_options_gpu; do
        if "$t/$b" --gtest_list_tests --gtest_filter="$fa" 2>/dev/null | grep -q '^  '; then
          cmds="${cmds:+$cmds && }compute-sanitizer --tool $tool --error-exitcode 9 $t/$b --gtest_filter='$fa'"
        fi
      done
      step san_${tool}_attention 150 "${cmds:-echo 'no test matches SAN_ATTN'}" ;;
    esac
    case " $suites " in *" ce "*)
      step san_${tool}_ce 90 "compute-sanitizer --tool $tool --error-exitcode 9 $t/test_cross_entropy_gpu --gtest_filter='$fc'" ;;
    esac
    for n in $suites; do
      grep -E "ERROR SUMMARY|tests ran|PASSED|FAILED|Invalid|Race|hazard" "$logs/san_${tool}_$n.txt" | sort | uniq -c | head -12 | sed "s/^/$tool $n: /" >>"$sum" 2>/dev/null
    done
  done
fi

if want extra && [ -n "${EXTRA_CMD:-}" ]; then
  step extra "${EXTRA_LIMIT:-60}" "$EXTRA_CMD"
  tail -25 "$logs/extra.txt" >>"$sum" 2>/dev/null
fi

echo "-- done, $(( budget - $(left) )) s used" >>"$sum"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs check cmp 2>/dev/null
rm -rf "$logs" "$OUT/check" "$OUT/cmp"
