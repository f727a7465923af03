#!/usr/bin/env bash
# `cutrain train --num_experts`: a model with MoE blocks trains (the loss falls on a fixed batch,
# the per-block l_aux / dropped / expert load lines and metrics), both architectures, PR-MoE's
# pyramid with the residual MLP; random token selection (--moe_use_rts) on by default for top-1 and
# off with false; a resume from a mid-run checkpoint (which holds the expert
# tensors under DeepSpeed's names and the MoE options in config.json) continues with the
# uninterrupted run's losses, with or without the MoE flags; bad MoE flags are named before any work.
#   moe_train_cli.sh CUTRAIN_BINARY cpu|cuda   (exits 77 = skipped: no GPU for cuda)
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu
small_size
if [ "$device" = cpu ]; then size=(--hidden_dim 32 --num_heads 2 --num_layers 2 --vocab_size 64 --seq_length 16 --batch_size 2); fi
run() { "$bin" train --device "$device" --deepspeed_config configs/bf16_full.json "${size[@]}" "$@"; }

# The loss falls on a fixed batch: top-2 over 4 experts in block 1, each architecture.
for model in simple gpt2; do
  run --model "$model" --num_steps 30 --warmup_steps 1 --log_interval 10 --fixed_batch --learning_rate 3e-3 \
    --num_experts 4 --top_k 2 --metrics_file "$tmp/m_$model.jsonl" >"$tmp/a_$model.txt" 2>&1 \
    || { cat "$tmp/a_$model.txt"; fail "MoE training ($model)"; }
  grep -q "MoE blocks 1: 4 experts, top-2" "$tmp/a_$model.txt" || { cat "$tmp/a_$model.txt"; fail "no MoE line ($model)"; }
  grep -q "moe block 1 l_aux=" "$tmp/a_$model.txt" || fail "no per-block MoE line ($model)"
  if [ "$device" = cuda ]; then  # token dropping, no gate noise: the steps are captured
    grep -q "MoE layers in the CUDA graph" "$tmp/a_$model.txt" || { cat "$tmp/a_$model.txt"; fail "start line lacks the graph note"; }
  fi
  python3 - "$tmp/m_$model.jsonl" <<'PY' || fail "MoE metrics ($model)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
first, last = rows[0]["loss"], rows[-1]["loss"]
assert last < 0.7 * first, f"loss {first} -> {last} did not fall"
for r in rows:
    (m,) = r["moe"]
    assert m["layer"] == 1 and m["l_aux"] > 0 and m["dropped"] >= 0, m
    assert 0 <= m["expert_load_min"] <= m["expert_load_max"] <= m["capacity"], m
PY
done

# PR-MoE: a pyramid over blocks 0 and 1 (2 then 4 experts) with the residual MLP.
run --num_steps 3 --warmup_steps 1 --num_experts 2,4 --moe_layers 0,1 --mlp_type residual >"$tmp/p.txt" 2>&1 \
  || { cat "$tmp/p.txt"; fail "PR-MoE training"; }
grep -q "MoE blocks 0,1: 2,4 experts, top-1, .*residual MLP (PR-MoE)" "$tmp/p.txt" || { cat "$tmp/p.txt"; fail "PR-MoE line"; }

# Random token selection (--moe_use_rts, DeepSpeed's use_rts): top-1's default, as DeepSpeed's MoE;
# false keeps the first routes in token order. At capacity factor 0.5 routes are dropped in every
# forward, so the kept routes (and the losses) differ; the selection's keys come from the step's
# device seed words on the GPU, so the steps are still captured.
rts=(--num_steps 3 --warmup_steps 1 --num_experts 4 --moe_train_capacity_factor 0.5 --moe_eval_capacity_factor 0.5)
run "${rts[@]}" --loss_log_file "$tmp/rts_on.csv" >"$tmp/rts_on.txt" 2>&1 || { cat "$tmp/rts_on.txt"; fail "MoE run (rts default)"; }
grep -q "MoE blocks 1: 4 experts, top-1, .*token dropping, random token selection" "$tmp/rts_on.txt" \
  || { cat "$tmp/rts_on.txt"; fail "rts is not top-1's default"; }
run "${rts[@]}" --moe_use_rts false --loss_log_file "$tmp/rts_off.csv" >"$tmp/rts_off.txt" 2>&1 \
  || { cat "$tmp/rts_off.txt"; fail "MoE run with --moe_use_rts false"; }
grep -q "MoE blocks 1: 4 experts, top-1, .*token dropping, first tokens kept" "$tmp/rts_off.txt" \
  || { cat "$tmp/rts_off.txt"; fail "--moe_use_rts false not in the MoE line"; }
run "${rts[@]}" --moe-use-rts true --loss_log_file "$tmp/rts_true.csv" >"$tmp/rts_true.txt" 2>&1 \
  || { cat "$tmp/rts_true.txt"; fail "MoE run with --moe-use-rts true"; }
if [ "$device" = cpu ]; then cmp -s "$tmp/rts_on.csv" "$tmp/rts_true.csv" || fail "--moe_use_rts true differs from the default"; fi
if [ "$device" = cuda ]; then
  grep -q "MoE layers in the CUDA graph" "$tmp/rts_on.txt" || { cat "$tmp/rts_on.txt"; fail "rts run: no graph note"; }
fi
python3 - "$tmp/rts_on.csv" "$tmp/rts_off.csv" <<'PY' || fail "random token selection did not change the kept routes"
import sys
def rows(p): return [float(x.split(",")[1]) for x in open(p).read().split()[1:]]
on, off = rows(sys.argv[1]), rows(sys.argv[2])
assert len(on) == len(off) == 3, (on, off)
assert on[0] != off[0], ("step 0's loss is the same with and without rts", on, off)
PY
grep -q "moe block 1 l_aux=.*dropped=" "$tmp/rts_on.txt" || { cat "$tmp/rts_on.txt"; fail "rts run: no per-block line"; }

# Resume: 6 steps straight with a save after step 3, then 3 steps resumed from it.
moe=(--num_experts 4 --top_k 1 --moe_min_capacity 2 --moe_noisy_gate_policy Jitter)
run "${moe[@]}" --num_steps 6 --save "$tmp/ck" --save_interval 3 --loss_log_file "$tmp/full.csv" >"$tmp/f.txt" 2>&1 \
  || { cat "$tmp/f.txt"; fail "MoE run with --save"; }
if [ "$device" = cuda ]; then  # Jitter's seeds come from device words: captured too
  grep -q "MoE layers in the CUDA graph" "$tmp/f.txt" || { cat "$tmp/f.txt"; fail "Jitter run: no graph note"; }
  # Without token dropping the counts size the work on the host: eager steps, and the start line says why.
  run --num_steps 3 --warmup_steps 1 --num_experts 4 --disable_moe_token_dropping >"$tmp/nd.txt" 2>&1 \
    || { cat "$tmp/nd.txt"; fail "MoE run without token dropping"; }
  grep -q "eager steps: the MoE layers are not CUDA-graph capturable (without token dropping" "$tmp/nd.txt" \
    || { cat "$tmp/nd.txt"; fail "start line lacks the eager note"; }
fi
python3 - "$tmp/ck/global_step3/model.safetensors" <<'PY' || fail "checkpoint lacks the expert tensors"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    names = json.loads(f.read(n))
for want in ["layers.1.ff.deepspeed_moe.gate.wg.weight",
             "layers.1.ff.deepspeed_moe.experts.deepspeed_experts.3.fc1.weight",
             "layers.1.ff.deepspeed_moe.experts.deepspeed_experts.0.fc2.weight"]:
    assert want in names, want
assert "layers.1.ff.0.weight" not in names and "layers.0.ff.0.weight" in names
PY
run "${moe[@]}" --resume "$tmp/ck/global_step3" --num_steps 3 --loss_log_file "$tmp/res.csv" >"$tmp/r.txt" 2>&1 \
  || { cat "$tmp/r.txt"; fail "MoE resume"; }
python3 - "$tmp/full.csv" "$tmp/res.csv" "$device" <<'PY' || fail "resumed losses differ from the uninterrupted run's"
import sys
def rows(p): return {int(s): float(l) for s, l in (x.split(",") for x in open(p).read().split()[1:])}
full, res, dev = rows(sys.argv[1]), rows(sys.argv[2]), sys.argv[3]
assert sorted(res) == [3, 4, 5], res
for s, l in res.items():
    ok = l == full[s] if dev == "cpu" else abs(l - full[s]) <= 1e-4 * abs(full[s])
    assert ok, (s, l, full[s])
PY
# Without MoE flags the resume takes the checkpoint's MoE blocks (config.json's "moe"); other
# experts per block are refused, named.
run --resume "$tmp/ck/global_step3" --num_steps 3 --loss_log_file "$tmp/res2.csv" >"$tmp/d.txt" 2>&1 \
  || { cat "$tmp/d.txt"; fail "MoE resume without the MoE flags"; }
grep -q "MoE blocks 1: 4 experts, top-1, .*random token selection, .*noisy gate Jitter" "$tmp/d.txt" || { cat "$tmp/d.txt"; fail "resume did not take the checkpoint's MoE"; }
python3 - "$tmp/ck/global_step3/config.json" <<'PY' || fail "config.json's moe lacks use_rts"
import json, sys
moe = json.load(open(sys.argv[1]))["moe"]
assert moe["use_rts"] is True and moe["top_k"] == 1, moe
PY
cmp -s "$tmp/res.csv" "$tmp/res2.csv" || [ "$device" = cuda ] || fail "the flagless resume's losses differ"
if run --resume "$tmp/ck/global_step3" --num_steps 1 --num_experts 2 --top_k 1 >"$tmp/d.txt" 2>&1; then fail "resume with other experts accepted"; fi
grep -q "give experts per block 0,2, the checkpoint (.*config.json) has 0,4" "$tmp/d.txt" || { cat "$tmp/d.txt"; fail "resume mismatch not named"; }

# Bad MoE flags, named before any work.
expect_error() {  # expect_error TEXT ARGS...
  local want=$1; shift
  if run --num_steps 1 "$@" >"$tmp/e.txt" 2>&1; then fail "accepted: $*"; fi
  grep -qF -- "$want" "$tmp/e.txt" || { cat "$tmp/e.txt"; fail "error lacks '$want'"; }
  grep -q "Step 0" "$tmp/e.txt" && fail "a step ran before the error: $*"
  true
}
expect_error "--top_k 2 is more than --num_experts 1" --num_experts 1 --top_k 2
expect_error "--top_k must be 1 or 2" --num_experts 8 --top_k 3
expect_error "--moe_train_capacity_factor must be a finite number > 0, got 0" --num_experts 4 --moe_train_capacity_factor 0
expect_error "--moe_eval_capacity_factor must be a finite number > 0, got -1" --num_experts 4 --moe_eval_capacity_factor -1
expect_error "--moe_expert_parallel_size 3 does not divide --num_experts 4" --num_experts 4 --moe_expert_parallel_size 3
# one process: ep_size 2 does not divide its world of 1 (either device)
expect_error "--moe_expert_parallel_size 2 does not divide the data-parallel world size 1" --num_experts 4 --moe_expert_parallel_size 2
expect_error "--num_experts lists 3 counts, expected 1 or one per MoE block (1)" --num_experts 2,4,8
expect_error "--moe_layers: block 5 is outside [0, 2)" --num_experts 4 --moe_layers 0,5
expect_error "configure MoE blocks: expected --num_experts too" --top_k 2
expect_error "--mlp_type: expected standard or residual" --num_experts 4 --mlp_type dense
expect_error "--moe_noisy_gate_policy: expected None, Jitter or RSample" --num_experts 4 --moe_noisy_gate_policy Gaussian
expect_error "RSample routes top-1 only" --num_experts 4 --top_k 2 --moe_noisy_gate_policy RSample
expect_error "--moe_use_rts: expected true or false, found 'maybe'" --num_experts 4 --moe_use_rts maybe
expect_error "--moe_use_rts true (random token selection) is top-1's (DeepSpeed's top-2 has none), got --top_k 2" \
  --num_experts 4 --top_k 2 --moe_use_rts true
expect_error "--moe_use_rts configure MoE blocks: expected --num_experts too" --moe_use_rts false
expect_error "--moe_layers and --expert_interval both given" --num_experts 4 --moe_layers 1 --expert_interval 2
expect_error "hold dense MLPs" --model gpt2 --num_experts 4 --save_hf "$tmp/x.safetensors"
# MoE under the CPU backend's pipeline is refused, naming both flags.
if [ "$device" = cpu ]; then
  if "$bin" launch --backend host --num_procs 2 --master_port "$(free_port)" -- "$bin" train \
      --device cpu --deepspeed_config configs/bf16_full.json "${size[@]}" --num_steps 1 --num_experts 4 --pipeline_parallel_size 2 >"$tmp/pp.txt" 2>&1; then
    cat "$tmp/pp.txt"; fail "MoE with a pipeline accepted"
  fi
  grep -q "num_experts with --pipeline_parallel_size 2: a pipeline of MoE blocks is not built" "$tmp/pp.txt" \
    || { cat "$tmp/pp.txt"; fail "MoE x pipeline message"; }
fi
echo "moe_train_cli ($device): ok"
