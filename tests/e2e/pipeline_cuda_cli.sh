#!/usr/bin/env bash
# End to end, the GPU pipeline over ranks: `cutrain launch --num_gpus 2 -- cutrain train --device cuda
# --pipeline_parallel_size 2` (one stage per GPU, activations and their gradients sent over NCCL)
# against the single-process run of the same job, and with 4 GPUs 2 stages x 2 replicas. Random
# data (the default) is the same on every rank and --fixed_batch keeps it, so every replica sees the
# single process's micro-batches: the losses (logged by rank 0, stage 0, from the last stage's
# broadcast) must equal the single process's within 1e-5 (the norm's sum of squares is
# summed per stage, then over the stages), and the step folder rank 0 writes (the stages' ranges
# summed over the pipeline group) the single process's tensors within 1e-3 relative by norm.
# Needs 2 GPUs and NCCL.
#   pipeline_cuda_cli.sh CUTRAIN_BINARY cpu|cuda     (exits 77 = skipped: cpu, or fewer than 2 GPUs)
source "$(dirname "$0")/e2e_lib.sh"
clear_launch_env
[ "$device" = cuda ] || { echo "a GPU pipeline needs CUDA devices: skipped on cpu"; exit 77; }
if grep -q "no CUDA device" <<<"$("$bin" info 2>&1 || true)"; then echo "no CUDA device: skipped"; exit 77; fi
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
[ "${gpus:-0}" -ge 2 ] || { echo "needs 2 GPUs, found ${gpus:-0}: skipped"; exit 77; }
port=$((29700 + $$ % 1000))
size=(--hidden_dim 128 --num_heads 2 --num_layers 4 --vocab_size 1000 --seq_length 64 --batch_size 2
      --num_steps 6 --warmup_steps 2 --log_interval 1 --fixed_batch --learning_rate 1e-2 --seed 7
      --partition_method uniform)
python3 - "$tmp/a4.json" <<'PY'
import json, sys
c = json.load(open("configs/baseline.json"))
c["zero_optimization"]["stage"] = 0
c["gradient_accumulation_steps"] = 4
c["gradient_clipping"] = 1.0
json.dump(c, open(sys.argv[1], "w"))
PY
"$bin" train --deepspeed_config "$tmp/a4.json" --device cuda "${size[@]}" --loss_log_file "$tmp/single.csv" \
    --save "$tmp/ck_single" >"$tmp/single.txt" 2>&1 || { cat "$tmp/single.txt"; fail "single-process run"; }

run_pp() {  # run_pp NGPUS NAME: NGPUS ranks, 2 stages, against the single process
  local n=$1 name=$2 out=$tmp/$2.txt
  "$bin" launch --num_gpus "$n" --master_port $port -- bash -c \
      'exec "$0" train --deepspeed_config "$1" --device cuda --pipeline_parallel_size 2 "${@:4}" \
           --loss_log_file "$2.r$RANK.csv" --save "$3"' \
      "$bin" "$tmp/a4.json" "$tmp/$name" "$tmp/ck_$name" "${size[@]}" >"$out" 2>&1 || { cat "$out"; fail "$name run"; }
  grep -q "pipeline: 2 stages, partition_method uniform" "$out" || { cat "$out"; fail "$name: the partition line"; }
  for s in 0 1; do
    grep -q "stage $s of 2 on this rank (layers .*over the nccl pipeline group" "$out" \
        || { cat "$out"; fail "$name: stage $s line"; }
  done
  python3 - "$tmp/single.csv" "$tmp/$name.r0.csv" <<'PY' || { cat "$out"; fail "$name: losses"; }
import csv, sys
runs = [[float(r["loss"]) for r in csv.DictReader(open(p))] for p in sys.argv[1:]]
assert all(len(r) == 6 for r in runs), runs
for a, b in zip(runs[0], runs[1]):
    assert abs(a - b) <= 1e-5 * max(1.0, abs(a)), ("pipeline != single process", runs[0], runs[1])
PY
  python3 - "$tmp/ck_single/global_step6" "$tmp/ck_$name/global_step6" <<'PY' || fail "$name: checkpoint"
import json, math, struct, sys
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, t in head.items():
        if k == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = data[b:e]
        if t["dtype"] == "F32":
            v = struct.unpack("<%df" % (len(raw) // 4), raw)
        elif t["dtype"] == "BF16":
            v = [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
        else:
            v = list(raw)
        out[k] = (t["dtype"], t["shape"], v)
    return out
for f in ("model.safetensors", "optimizer.safetensors"):
    a, b = tensors(sys.argv[1] + "/" + f), tensors(sys.argv[2] + "/" + f)
    assert a.keys() == b.keys(), (f, sorted(a), sorted(b))
    for k in a:
        assert a[k][:2] == b[k][:2], (f, k, a[k][:2], b[k][:2])
        d = math.sqrt(sum((x - y) ** 2 for x, y in zip(a[k][2], b[k][2])))
        r = math.sqrt(sum(x * x for x in a[k][2]))
        assert d <= 1e-3 * max(r, 1e-12), (f, k, "relative difference", d / max(r, 1e-12))
PY
  echo "ok: $name = the single process (losses, checkpoint)"
}
run_pp 2 pp2
if [ "${gpus:-0}" -ge 4 ]; then run_pp 4 pp2dp2; else echo "2 stages x 2 replicas need 4 GPUs: skipped"; fi
