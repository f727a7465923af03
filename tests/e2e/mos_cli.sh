#!/usr/bin/env bash
# `cutrain train --mos`: Mixture-of-Students' staged distillation end to end. A tiny MoE teacher is
# trained and saved; a smaller PR-MoE student distills from it (the teacher flags checked against its
# config.json) until --stop_kd_step, where the log says the teacher is freed; the metrics carry
# ce_loss and kd_loss; the steps after the stop equal an LM-only run resumed from the same state
# (bit for bit on the CPU, 1e-4 relative on the GPU); --reset_iteration; the dashed spellings; bad
# input named before any step. The GPU runs head_dim 64 models (the attention kernel's).
#   mos_cli.sh CUTRAIN_BINARY cpu|cuda   (exits 77 = skipped: no GPU for cuda)
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu
# The teacher's hidden size TH, the student's SH, vocabulary V, sequence S for the device.
if [ "$device" = cuda ]; then TH=128 SH=128 V=1000 S=64; else TH=48 SH=32 V=64 S=8; fi
# VOCAB / SEQ: another vocabulary or sequence length for one call
run() { "$bin" train --device "$device" --deepspeed_config configs/baseline.json --vocab_size "${VOCAB:-$V}" \
  --seq_length "${SEQ:-$S}" --batch_size 2 --num_heads 2 --warmup_steps 1 --learning_rate 3e-3 "$@"; }
expect_error() {  # expect_error TEXT ARGS...
  local want=$1; shift
  if run --num_steps 1 "$@" >"$tmp/e.txt" 2>&1; then fail "accepted: $*"; fi
  grep -qF -- "$want" "$tmp/e.txt" || { cat "$tmp/e.txt"; fail "error lacks '$want'"; }
}
# The teacher: 3 blocks of TH, block 1 a MoE block of 4 experts, trained 4 steps and saved.
run --hidden_dim "$TH" --num_layers 3 --num_experts 4 --num_steps 4 --save "$tmp/teacher" >"$tmp/t.txt" 2>&1 \
  || { cat "$tmp/t.txt"; fail "teacher run"; }

# The student: 2 blocks of SH, PR-MoE (block 1: 2 experts with the residual MLP), distilled for
# steps 0-2, a save after step 3.
student=(--hidden_dim "$SH" --num_layers 2 --num_experts 2 --mlp_type residual)
mos=(--mos --load_teacher "$tmp/teacher" --num_layers_teacher 3 --hidden_size_teacher "$TH" --num_attention_heads_teacher 2
     --num_experts_teacher 4 --kd_alpha_ce 1 --kd_beta_ce 0.5 --kd_temp 2 --stop_kd_step 3)
run "${student[@]}" "${mos[@]}" --num_steps 6 --log_interval 1 --metrics_file "$tmp/m.jsonl" \
  --loss_log_file "$tmp/kd.csv" --save "$tmp/st" --save_interval 3 >"$tmp/s.txt" 2>&1 \
  || { cat "$tmp/s.txt"; fail "MoS run"; }
for want in "Mixture-of-Students: teacher $tmp/teacher/global_step4 (step 4): SimpleTransformerModel, 3 layers, hidden $TH, 2 heads, MoE blocks 1: 4 experts" \
            "objective = 1 * ce + 0.5 * T^2 * KL(teacher || student) (T = 2" "until step 3 (--stop_kd_step" \
            "Step 3: knowledge distillation stopped (--stop_kd_step 3): the teacher is freed" \
            "Step 2: distillation ce_loss="; do
  grep -qF -- "$want" "$tmp/s.txt" || { cat "$tmp/s.txt"; fail "log lacks '$want'"; }
done
if grep -q "Step [345]: distillation" "$tmp/s.txt"; then fail "distillation lines after the stop step"; fi
python3 - "$tmp/m.jsonl" <<'PY' || fail "MoS metrics"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == list(range(6)), rows
for r in rows:
    assert r["ce_loss"] == r["loss"], r
    if r["step"] < 3:
        assert r["distilled"] and r["kd_loss"] > 0, r
    else:
        assert not r["distilled"] and r["kd_loss"] == 0, r
PY

# The steps after the stop are an LM-only run: resume the student's step-3 checkpoint without
# distillation and get the same losses, bit for bit.
run "${student[@]}" --resume "$tmp/st/global_step3" --num_steps 3 --loss_log_file "$tmp/lm.csv" >"$tmp/r.txt" 2>&1 \
  || { cat "$tmp/r.txt"; fail "LM-only resume"; }
python3 - "$tmp/kd.csv" "$tmp/lm.csv" "$device" <<'PY' || fail "the steps after the stop differ from the LM-only run"
import sys
def rows(p): return {int(s): l for s, l in (x.split(",") for x in open(p).read().split()[1:])}
kd, lm = rows(sys.argv[1]), rows(sys.argv[2])
assert sorted(lm) == [3, 4, 5], lm
for s in lm:
    ok = lm[s] == kd[s] if sys.argv[3] == "cpu" else abs(float(lm[s]) - float(kd[s])) <= 1e-4 * abs(float(kd[s]))
    assert ok, (s, lm[s], kd[s])
PY

# --reset_iteration: the resumed run starts at step 0 again; the dashed spellings; --kd on a dense student.
run "${student[@]}" --resume "$tmp/st/global_step3" --reset_iteration --num_steps 1 --log_interval 1 >"$tmp/ri.txt" 2>&1 \
  || { cat "$tmp/ri.txt"; fail "--reset_iteration"; }
grep -q "the step count starts again at 0" "$tmp/ri.txt" && grep -q "Step 0: loss=" "$tmp/ri.txt" \
  || { cat "$tmp/ri.txt"; fail "--reset_iteration did not start at step 0"; }
run --hidden_dim "$SH" --num_layers 1 --kd --load-teacher "$tmp/teacher" --kd-temp 1.5 --kd-beta-ce 2 --num_steps 2 \
  --log_interval 1 >"$tmp/kd.txt" 2>&1 || { cat "$tmp/kd.txt"; fail "--kd with the dashed spellings"; }
grep -q "Knowledge distillation: objective = 1 \* ce + 2 \* T^2 \* KL(teacher || student) (T = 1.5" "$tmp/kd.txt" \
  && grep -q "Step 1: distillation ce_loss=" "$tmp/kd.txt" || { cat "$tmp/kd.txt"; fail "--kd lines"; }

# Bad input, named before any step.
VOCAB=$((V * 2)) expect_error "vocab_size: the teacher has $V" --hidden_dim "$SH" --num_layers 2 --mos --load_teacher "$tmp/teacher"
expect_error "--num_layers_teacher gives 4, the teacher's" --hidden_dim "$SH" --num_layers 2 --mos --load_teacher "$tmp/teacher" --num_layers_teacher 4
expect_error "--num_experts_teacher gives 8, the teacher's" --hidden_dim "$SH" --num_layers 2 --mos --load_teacher "$tmp/teacher" --num_experts_teacher 8
SEQ=$((S * 2)) expect_error "max_seq_len: the teacher's position table has $S rows" --hidden_dim "$SH" --num_layers 2 --mos --load_teacher "$tmp/teacher"
expect_error "no such folder" --hidden_dim "$SH" --num_layers 2 --mos --load_teacher "$tmp/no_teacher"
expect_error "--load_teacher, --kd_temp configure knowledge distillation: expected --mos (or --kd) too" --hidden_dim "$SH" --num_layers 2 --kd_temp 2 --load_teacher "$tmp/teacher"
expect_error "--mos distills from a teacher: expected --load_teacher DIR" --hidden_dim "$SH" --num_layers 2 --mos
expect_error "--kd_temp must be a finite number > 0, got 0" --hidden_dim "$SH" --num_layers 2 --mos --load_teacher "$tmp/teacher" --kd_temp 0
expect_error "--kd_temp must be a finite number > 0, got -1" --hidden_dim "$SH" --num_layers 2 --mos --load_teacher "$tmp/teacher" --kd_temp -1
expect_error "--stop_kd_step must be >= 0" --hidden_dim "$SH" --num_layers 2 --mos --load_teacher "$tmp/teacher" --stop_kd_step -2
expect_error "--reset_iteration restarts a resumed run's step count" --hidden_dim "$SH" --num_layers 2 --reset_iteration
echo "mos_cli: ok"
