#!/usr/bin/env bash
# End to end, tensor parallelism on GPUs: `cutrain launch --num_gpus T -- cutrain train --device
# cuda --tensor_parallel_size T` (TP 2, alone and with Domino's 2 pieces; with 4 GPUs also TP 4 and
# DP 2 x TP 2 at ZeRO 0, 1, 2) against the
# single-process run of the same job. Random data (the default) is the same on every rank and
# --fixed_batch keeps it, so the losses must be the single GPU's within bf16 round-off (the
# row-parallel partial sums are summed over the group in bf16, so not bit for bit); the checkpoint
# (the group's sum, written by rank 0) holds the single process's tensors within bf16 round-off and
# one process resumes it as it resumes its own. GPT-2 (tied head) at TP 2.
# Needs 2 GPUs and NCCL.
#   tensor_gpu_cli.sh CUTRAIN_BINARY cpu|cuda     (exits 77 = skipped: cpu, or fewer than 2 GPUs)
source "$(dirname "$0")/e2e_lib.sh"
[ "$device" = cuda ] || { echo "tensor parallelism over NCCL needs CUDA devices: skipped on cpu"; exit 77; }
if grep -q "no CUDA device" <<<"$("$bin" info 2>&1 || true)"; then echo "no CUDA device: skipped"; exit 77; fi
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
[ "${gpus:-0}" -ge 2 ] || { echo "needs 2 GPUs, found ${gpus:-0}: skipped"; exit 77; }
clear_launch_env
base=(--hidden_dim 256 --num_heads 4 --num_layers 2 --vocab_size 1000 --seq_length 64 --batch_size 2
      --warmup_steps 2 --log_interval 1 --fixed_batch --learning_rate 1e-3 --seed 7)
cfg=configs/baseline.json

close_losses() {  # close_losses A.csv B.csv: B within bf16 round-off of A
  python3 - "$@" <<'PY'
import csv, sys
runs = [[float(r["loss"]) for r in csv.DictReader(open(p))] for p in sys.argv[1:]]
assert all(len(r) == len(runs[0]) and r for r in runs), runs
for a, b in zip(runs[0], runs[1]):
    assert abs(a - b) <= 2e-2 * abs(a), ("tensor parallel != single process", runs[0], runs[1])
PY
}
close_checkpoints() {  # close_checkpoints A_STEP B_STEP: every tensor within 2e-2 by relative norm (bf16 or fp32)
  python3 - "$1" "$2" <<'PY'
import json, math, struct, sys
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]; head = json.loads(f.read(n)); data = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__": continue
        raw = data[t["data_offsets"][0]:t["data_offsets"][1]]
        if t["dtype"] == "F32": vals = struct.unpack("<%df" % (len(raw) // 4), raw)
        elif t["dtype"] == "BF16":
            vals = [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in struct.unpack("<%dH" % (len(raw) // 2), raw)]
        else: sys.exit(f"{path}: {name}: unexpected dtype {t['dtype']}")
        out[name] = (t["shape"], vals)
    return out
for f in ("model.safetensors", "optimizer.safetensors"):
    a, b = tensors(sys.argv[1] + "/" + f), tensors(sys.argv[2] + "/" + f)
    assert a.keys() == b.keys(), (f, sorted(a.keys() ^ b.keys()))
    for name in a:
        assert a[name][0] == b[name][0], (f, name, a[name][0], b[name][0])
        if f != "model.safetensors": continue  # the moments: names and shapes (Adam's v amplifies round-off)
        x, y = a[name][1], b[name][1]
        d = math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y))); n = math.sqrt(sum(p * p for p in x))
        assert d <= 2e-2 * max(n, 1e-6), (f, name, d / max(n, 1e-6))
PY
}

"$bin" train --device cuda "${base[@]}" --num_steps 6 --deepspeed_config $cfg --loss_log_file "$tmp/single.csv" --save "$tmp/ck_single" \
    >"$tmp/single.txt" 2>&1 || { cat "$tmp/single.txt"; fail "single-process run"; }
"$bin" train --device cuda "${base[@]}" --deepspeed_config $cfg --num_steps 2 --resume "$tmp/ck_single" \
    --loss_log_file "$tmp/single_r.csv" \
    >"$tmp/single_r.txt" 2>&1 || { cat "$tmp/single_r.txt"; fail "single-process resume"; }

# run_tp NAME RANKS TP CONFIG [flags...]: against $ref (losses, checkpoint, a resume by one process);
# $tp_flags: flags of the tensor-parallel run only (not of the resume by one process)
tp_flags=()
run_tp() {
  local name=$1 ranks=$2 t=$3 config=$4; shift 4
  local out=$tmp/$name.txt port; port=$(free_port)
  "$bin" launch --num_gpus "$ranks" --master_port "$port" -- bash -c \
      'exec "$0" train --device cuda "${@:3}" --loss_log_file "$1.r$RANK.csv" --save "$2"' \
      "$bin" "$tmp/$name" "$tmp/ck_$name" "${base[@]}" --num_steps 6 --deepspeed_config "$config" \
      --tensor_parallel_size "$t" "${tp_flags[@]}" "$@" \
      >"$out" 2>&1 \
      || { cat "$out"; fail "$name run"; }
  for ((r = 0; r < ranks; r++)); do
    grep -q "^\[Rank $r\] tensor parallel: rank $((r % t)) of $t: heads " "$out" || { cat "$out"; fail "$name: rank $r's slice"; }
  done
  # Rank 0 writes the loss log (every rank of a group computes the same loss bits: the loss's
  # statistics are all-reduced; test_tensor_parallel_gpu checks that).
  close_losses "$tmp/$ref.csv" "$tmp/$name.r0.csv" || { cat "$out"; fail "$name: losses"; }
  close_checkpoints "$tmp/ck_$ref/global_step6" "$tmp/ck_$name/global_step6" || fail "$name: checkpoint"
  "$bin" train --device cuda "${base[@]}" --deepspeed_config "$config" "$@" --num_steps 2 --resume "$tmp/ck_$name" \
      --loss_log_file "$tmp/${name}_r.csv" \
      >"$tmp/${name}_r.txt" 2>&1 || { cat "$tmp/${name}_r.txt"; fail "$name: resumed by one process"; }
  close_losses "$tmp/${ref}_r.csv" "$tmp/${name}_r.csv" || fail "$name: the resumed losses"
  echo "ok: $name ($ranks ranks, TP $t) = the single process (losses, checkpoint, resume)"
}

ref=single
run_tp tp2 2 2 $cfg
tp_flags=(--domino 2)
run_tp tp2_domino 2 2 $cfg
tp_flags=()
if [ "$gpus" -ge 4 ]; then
  run_tp tp4 4 4 $cfg
  run_tp dp2tp2 4 2 $cfg
  for z in 1 2; do
    python3 - "$tmp/z$z.json" "$z" <<'PY'
import json, sys
c = json.load(open("configs/baseline.json")); c["zero_optimization"]["stage"] = int(sys.argv[2])
json.dump(c, open(sys.argv[1], "w"))
PY
    run_tp dp2tp2_z$z 4 2 "$tmp/z$z.json"
  done
fi
"$bin" train --device cuda "${base[@]}" --num_steps 6 --deepspeed_config $cfg --model gpt2 --loss_log_file "$tmp/gpt2.csv" \
    --save "$tmp/ck_gpt2" \
    >"$tmp/gpt2.txt" 2>&1 || { cat "$tmp/gpt2.txt"; fail "GPT-2 single-process run"; }
"$bin" train --device cuda "${base[@]}" --deepspeed_config $cfg --model gpt2 --num_steps 2 --resume "$tmp/ck_gpt2" \
    --loss_log_file "$tmp/gpt2_r.csv" >"$tmp/gpt2_r.txt" 2>&1 || { cat "$tmp/gpt2_r.txt"; fail "GPT-2 resume"; }
ref=gpt2
run_tp gpt2_tp2 2 2 $cfg --model gpt2

# Refused, named: ZeRO-3 with the GPU's tensor parallelism.
python3 - "$tmp/z3.json" <<'PY'
import json, sys
c = json.load(open("configs/baseline.json")); c["zero_optimization"]["stage"] = 3
json.dump(c, open(sys.argv[1], "w"))
PY
port=$(free_port)
if "$bin" launch --num_gpus 2 --master_port "$port" -- "$bin" train --device cuda --hidden_dim 256 --num_heads 4 \
    --num_layers 2 --vocab_size 1000 --seq_length 64 --batch_size 2 --num_steps 1 --deepspeed_config "$tmp/z3.json" \
    --tensor_parallel_size 2 >"$tmp/z3.txt" 2>&1; then cat "$tmp/z3.txt"; fail "ZeRO-3 with GPU tensor parallelism accepted"; fi
grep -q "zero_optimization.stage 3 with --tensor_parallel_size 2 on the GPU engine" "$tmp/z3.txt" \
    || { cat "$tmp/z3.txt"; fail "the ZeRO-3 message"; }
echo "ok: ZeRO-3 with GPU tensor parallelism refused"
