#!/usr/bin/env bash
# Kill test of checkpoints (CPU backend and GPU engine, both deterministic): a run saving every 2 steps with
# --keep_last 2 is killed with SIGKILL at every stage of a save (the test-only fault point
# CUTRAIN_TEST_CHECKPOINT_KILL=<stage>@<step>, docs/training.md) and at random instants; after each
# kill `--resume` (no shape flags) must continue from the last complete save (the step each stage
# implies) into the same root, reproduce the uninterrupted run's losses bit for bit and leave no
# temporaries, or, with no complete save yet, refuse saying so. A mixed step folder is refused.
# Saves are asynchronous (the default --save_mode): the stage kills land in the background
# writer's thread, the random ones anywhere in the step loop or the write.
#   checkpoint_kill_cli.sh CUTRAIN_BINARY cpu|cuda     (cuda: skipped without a GPU)
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu
small_size
# On the GPU a run is mostly start-up (about a second), so the random kills use a longer run.
if [ "$device" = cuda ]; then rand_steps=60; layout=bf16_full; else rand_steps=8; layout=baseline; fi
run_flags=(--deepspeed_config configs/$layout.json --device "$device" --warmup_steps 1 --log_interval 1
           --learning_rate 1e-2 --seed 11)
save_flags=(--save_interval 2 --keep_last 2)
for n in 8 $rand_steps; do
  "$bin" train "${run_flags[@]}" "${size[@]}" --num_steps $n --loss_log_file "$tmp/ref$n.csv" >"$tmp/ref.txt" 2>&1 \
    || { cat "$tmp/ref.txt"; fail "uninterrupted run of $n steps"; }
done
steps=8

# check_resume ROOT EXPECTED_STEP LABEL: resume from ROOT (saving on into it), compare the losses.
check_resume() {
  local ck=$1 want=$2 label=$3
  if [ "$want" = none ]; then
    if "$bin" train "${run_flags[@]}" --batch_size 2 --num_steps 1 --resume "$ck" >"$tmp/r.txt" 2>&1; then
      cat "$tmp/r.txt"; fail "$label: resume accepted a root with no complete save"
    fi
    grep -Eq "found neither|does not exist" "$tmp/r.txt" || { cat "$tmp/r.txt"; fail "$label: refusal message"; }
    return
  fi
  [ "$(cat "$ck/latest")" = "global_step$want" ] || fail "$label: latest is '$(cat "$ck/latest")', expected global_step$want"
  if [ "$want" = "$steps" ]; then  # the last save completed: it must verify and resume at the end
    "$bin" train "${run_flags[@]}" --batch_size 2 --num_steps 1 --resume "$ck" >"$tmp/r.txt" 2>&1 \
      || { cat "$tmp/r.txt"; fail "$label: resume of the final save"; }
    grep -q "Resumed from $ck/global_step$want at step $want$" "$tmp/r.txt" || { cat "$tmp/r.txt"; fail "$label: resumed line"; }
    return
  fi
  "$bin" train "${run_flags[@]}" --batch_size 2 --num_steps $((steps - want)) --resume "$ck" --save "$ck" "${save_flags[@]}" \
      --loss_log_file "$tmp/res.csv" >"$tmp/r.txt" 2>&1 || { cat "$tmp/r.txt"; fail "$label: resume"; }
  grep -q "Resumed from $ck/global_step$want at step $want$" "$tmp/r.txt" || { cat "$tmp/r.txt"; fail "$label: resumed line"; }
  if ! diff <(awk -F, -v s="$want" 'NR > 1 && $1 >= s' "$tmp/ref$steps.csv") <(tail -n +2 "$tmp/res.csv") >/dev/null; then
    paste -d' ' "$tmp/ref$steps.csv" "$tmp/res.csv"; fail "$label: resumed losses differ from the uninterrupted run"
  fi
  [ "$(cat "$ck/latest")" = "global_step$steps" ] || fail "$label: latest after the resumed run"
  [ -z "$(ls -A "$ck" | grep -E '\.tmp')" ] || { ls -A "$ck"; fail "$label: temporaries left"; }
  [ "$(ls -d "$ck"/global_step* | wc -l)" -eq 2 ] || { ls "$ck"; fail "$label: --keep_last 2"; }
}

# kill_at STAGE STEP EXPECTED: the save of STEP (prune: the deletion of step folder STEP) is killed.
kill_at() {
  local stage=$1 at=$2 want=$3 ck=$tmp/ck_$1_$2 rc=0
  (CUTRAIN_TEST_CHECKPOINT_KILL="$stage@$at" exec "$bin" train "${run_flags[@]}" "${size[@]}" --num_steps $steps \
      --save "$ck" "${save_flags[@]}" >"$tmp/k.txt" 2>&1) 2>/dev/null || rc=$?
  [ $rc -eq 137 ] || { cat "$tmp/k.txt"; fail "$stage@$at: expected death by SIGKILL (137), got $rc"; }
  check_resume "$ck" "$want" "$stage@$at"
  echo "ok: killed at $stage@$at, resumed from ${want}"
}
kill_at files 2 none
kill_at manifest 2 none
kill_at rename 2 none
kill_at latest 2 2
for s in 4 8; do
  kill_at files $s $((s - 2))
  kill_at manifest $s $((s - 2))
  kill_at rename $s $((s - 2))   # the new folder is complete but unnamed by latest: the resumed run replaces it
  kill_at latest $s $s
done
kill_at prune 2 6   # the save of 6 deletes 2
kill_at prune 4 8

# Random instants over short runs saving every step (externally killed; some runs finish first).
steps=$rand_steps
for i in 1 2 3 4 5 6 7 8; do
  ck=$tmp/rand_$i
  "$bin" train "${run_flags[@]}" "${size[@]}" --num_steps $steps --save "$ck" --save_interval 1 --keep_last 2 \
      >"$tmp/k.txt" 2>&1 &
  pid=$!
  # A CPU run takes about 0.1-0.8 s; a GPU run about 1 s of start-up, then its steps and saves.
  if [ "$device" = cuda ]; then
    sleep "$(printf '%d.%02d' $((RANDOM % 2 + 1)) $((RANDOM % 100)))"
  else
    sleep "$(printf '0.%02d' $((RANDOM % 65 + 5)))"
  fi
  kill -KILL $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  if [ -f "$ck/latest" ]; then
    got=$(sed 's/global_step//' "$ck/latest")
    check_resume "$ck" "$got" "random kill $i"
    echo "ok: random kill $i, resumed from $got"
  else
    check_resume "$ck" none "random kill $i"
    echo "ok: random kill $i before the first save, refused"
  fi
done

# A mixed folder (the model file of another save) is refused, naming the folder and the file.
steps=8
ck=$tmp/ck_latest_8
cp "$ck/global_step8/model.safetensors" "$ck/global_step6/model.safetensors"
if "$bin" train "${run_flags[@]}" --batch_size 2 --num_steps 1 --resume "$ck/global_step6" >"$tmp/m.txt" 2>&1; then
  fail "a mixed step folder was accepted"
fi
grep -q "checkpoint $ck/global_step6: file model.safetensors: expected XXH64 [0-9a-f]*, found [0-9a-f]*" "$tmp/m.txt" \
  || { cat "$tmp/m.txt"; fail "mixed-folder message"; }
echo "PASS"
