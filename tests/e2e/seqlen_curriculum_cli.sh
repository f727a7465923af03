#!/usr/bin/env bash
# End to end: the sequence-length curriculum in `cutrain train` (data_efficiency's seqlen_truncate
# and seqlen_reshape, the legacy curriculum_learning block) on a small model: the curriculum line,
# the per-interval seqlen lines, curriculum_seqlen / curriculum_rows / tokens / consumed_tokens in
# the metrics against the pacing and Megatron-DeepSpeed's row counts, tokens_per_s of the real
# tokens, a resumed run's losses and figures equal to the straight run's, --lr_decay_tokens's lr
# against the token-based decay, real data, and each bad input named before any step. CPU only:
# ZeRO 2 over the host launcher: 2 ranks (micro-batch 1 each, global batch 2) give the single
# process's truncate losses (truncate rebuilds each sample on its own), the tokens counted over both.
python3 - "$tmp/seqlen_truncate.json" "$tmp/z.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"] = {"stage": 2}
c["train_micro_batch_size_per_gpu"] = 1
c["train_batch_size"] = 2
json.dump(c, open(sys.argv[2], "w"))
PY
port=$(free_port)
"$bin" launch --backend host --num_procs 2 --master_port $port -- "$bin" train --device cpu "${size[@]}" --batch_size 1 \
  --attention causal --log_interval 2 --deepspeed_config "$tmp/z.json" --seed 3 --num_steps 6 --loss_log_file "$tmp/z.csv" \
  --metrics_file "$tmp/z.jsonl" >"$tmp/z.txt" 2>&1 || { cat "$tmp/z.txt"; fail "ZeRO 2 on 2 ranks"; }
same_losses "$tmp/seqlen_truncate.csv" "$tmp/z.csv" "ZeRO 2 on 2 ranks"
python3 - "$tmp/z.jsonl" "$tmp/seqlen_truncate.jsonl" <<'PY' || fail "ZeRO 2 metrics"
import json, sys
z = [json.loads(l) for l in open(sys.argv[1])]
one = [json.loads(l) for l in open(sys.argv[2])]
assert [(r["curriculum_seqlen"], r["tokens"], r["consumed_tokens"]) for r in z] == \
       [(r["curriculum_seqlen"], r["tokens"], r["consumed_tokens"]) for r in one], (z, one)
PY
echo "ok: ZeRO 2 over 2 host ranks"
