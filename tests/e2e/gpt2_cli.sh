#!/usr/bin/env bash
# End to end, GPT-2: `cutrain train --model gpt2` on llm.c token shards writes llm.c's model file
# (--save_llmc: its header and size checked here) and HF safetensors (--save_hf); a run started
# from that file (--init_from_llmc) whose only step has lr 0 (WarmupCosineLR's step 0) writes it
# back byte for byte; --init_from_hf of its safetensors evaluates the same; --resume of a GPT-2
# checkpoint builds GPT-2 again; the llm.c configs draw llm.c's batch order (cutrain.data_order),
# --data_order overrides it; the input errors name the file or the flag.
#   gpt2_cli.sh CUTRAIN_BINARY cpu|cuda   (exits 77 = skipped: no GPU for cuda)
source "$(dirname "$0")/e2e_lib.sh"
skip_without_gpu
python3 - "$tmp" <<'PY'
import random, struct, sys
random.seed(1)
for name, n in (("train", 6000), ("val", 3000)):
    t = [int(random.paretovariate(1.2)) % 50257 for _ in range(n)]
    h = [0] * 256; h[0], h[1], h[2] = 20240520, 1, n
    open(f"{sys.argv[1]}/{name}.bin", "wb").write(struct.pack("256i", *h) + struct.pack(f"{n}H", *t))
PY
if [ "$device" = cuda ]; then C=128; H=2; else C=32; H=2; fi
size=(--model gpt2 --hidden_dim $C --num_heads $H --num_layers 2)
data=(--use_real_data --data "$tmp/train.bin" --eval_data "$tmp/val.bin" --eval_steps 2)
run() { "$bin" train --device "$device" "${data[@]}" --seq_length 16 --batch_size 2 --log_interval 1 "$@"; }

run --deepspeed_config configs/llmc_gpt2_constant.json "${size[@]}" --num_steps 3 --save_llmc "$tmp/m.bin" \
    --save_hf "$tmp/m.safetensors" --save "$tmp/ck" >"$tmp/a.txt" 2>&1 || { cat "$tmp/a.txt"; fail "gpt2 run"; }
grep -q "Creating GPT-2 (pre-LN, tied head, tanh GELU)" "$tmp/a.txt" || fail "no GPT-2 creation line"
grep -q -- "--pad_vocab 128: 50257 -> 50304 rows" "$tmp/a.txt" || fail "GPT-2 does not pad to 128"
grep -q "Objective: next-token labels, causal attention" "$tmp/a.txt" || fail "GPT-2 is not causal"
grep -q "llm.c checkpoint saved to: $tmp/m.bin (bf16, version 5)" "$tmp/a.txt" || fail "no --save_llmc line"
grep -qF "Data order: llm.c's DataLoader (configs/llmc_gpt2_constant.json: cutrain.data_order \"llmc\"): shard order and each shard's samples permuted by MT19937 seeded 42 + rank" \
  "$tmp/a.txt" || { cat "$tmp/a.txt"; fail "no llm.c data order line"; }
python3 - "$tmp/m.bin" "$C" <<'PY' || fail "llm.c header or size"
import os, struct, sys
C = int(sys.argv[2]); h = struct.unpack("256i", open(sys.argv[1], "rb").read(1024))
assert h[:8] == (20240326, 5, 16, 50257, 2, 2, C, 50304), h[:8]
n = 50304 * C + 16 * C + 2 * (4 * C + 3 * C * C + 3 * C + C * C + C + 8 * C * C + 4 * C + C) + 2 * C
assert os.path.getsize(sys.argv[1]) == 1024 + 2 * n, (os.path.getsize(sys.argv[1]), 1024 + 2 * n)
PY

# From llm.c's file; WarmupCosineLR's first step has lr 0, so the params come out as they went in.
run --deepspeed_config configs/llmc_gpt2.json --init_from_llmc "$tmp/m.bin" --num_steps 1 --save_llmc "$tmp/m2.bin" \
    --save_hf "$tmp/m2.safetensors" >"$tmp/b.txt" 2>&1 || { cat "$tmp/b.txt"; fail "--init_from_llmc run"; }
grep -q "Initialized from llm.c checkpoint $tmp/m.bin (bf16, 2 layers, $C channels, $H heads, vocab 50257 padded to 50304, 16 positions)" \
  "$tmp/b.txt" || { cat "$tmp/b.txt"; fail "no initialized line"; }
cmp -s "$tmp/m.bin" "$tmp/m2.bin" || fail "llm.c file not written back unchanged"
run --deepspeed_config configs/llmc_gpt2.json "${size[@]}" --max_seq_len 16 --init_from_hf "$tmp/m2.safetensors" \
    --num_steps 1 >"$tmp/c.txt" 2>&1 || { cat "$tmp/c.txt"; fail "--init_from_hf run"; }
e1=$(grep "Eval before training" "$tmp/b.txt"); e2=$(grep "Eval before training" "$tmp/c.txt")
[ -n "$e1" ] && [ "$e1" = "$e2" ] || fail "HF safetensors evaluate differently: '$e1' vs '$e2'"

# --resume of a GPT-2 checkpoint folder: GPT-2 again, from its config.json.
run --deepspeed_config configs/llmc_gpt2_constant.json --resume "$tmp/ck" --num_steps 1 >"$tmp/d.txt" 2>&1 \
  || { cat "$tmp/d.txt"; fail "--resume of a gpt2 checkpoint"; }
grep -q "Creating GPT-2" "$tmp/d.txt" || fail "--resume did not build GPT-2"

# --data_order wins over the config: shuffled draws other batches (another first loss), llmc the same.
first_loss() { grep -m1 "Step 0: loss=" "$1" | sed 's/.*loss=\([0-9.]*\).*/\1/'; }
run --deepspeed_config configs/llmc_gpt2_constant.json --init_from_llmc "$tmp/m.bin" --num_steps 1 --data_order llmc \
  >"$tmp/o1.txt" 2>&1 || { cat "$tmp/o1.txt"; fail "--data_order llmc"; }
run --deepspeed_config configs/llmc_gpt2_constant.json --init_from_llmc "$tmp/m.bin" --num_steps 1 \
  >"$tmp/o2.txt" 2>&1 || { cat "$tmp/o2.txt"; fail "the config's llmc order"; }
run --deepspeed_config configs/llmc_gpt2_constant.json --init_from_llmc "$tmp/m.bin" --num_steps 1 --data_order shuffled \
  >"$tmp/o3.txt" 2>&1 || { cat "$tmp/o3.txt"; fail "--data_order shuffled"; }
grep -qF "Data order: llm.c's DataLoader (--data_order llmc)" "$tmp/o1.txt" || fail "--data_order llmc not named"
grep -q "Data order" "$tmp/o3.txt" && fail "--data_order shuffled still names llm.c's order"
l1=$(first_loss "$tmp/o1.txt"); l2=$(first_loss "$tmp/o2.txt"); l3=$(first_loss "$tmp/o3.txt")
[ -n "$l1" ] && [ "$l1" = "$l2" ] || fail "the flag and the config's llm.c order differ: $l1 vs $l2"
[ -n "$l3" ] && [ "$l3" != "$l1" ] || fail "shuffled and llm.c's order gave the same first batch loss $l1"

# Input errors, named.
expect_error() {  # expect_error TEXT ARGS...
  local want=$1; shift
  if run "$@" >"$tmp/e.txt" 2>&1; then fail "accepted: $*"; fi
  grep -qF -- "$want" "$tmp/e.txt" || { cat "$tmp/e.txt"; fail "error lacks '$want'"; }
}
cfg=(--deepspeed_config configs/llmc_gpt2_constant.json --num_steps 1)
expect_error "$tmp/val.bin: magic 20240520 is not llm.c's model magic 20240326 (that is llm.c's token shard magic" \
  "${cfg[@]}" --init_from_llmc "$tmp/val.bin"
expect_error "--hidden_dim gives 64, the llm.c checkpoint $tmp/m.bin has $C" "${cfg[@]}" --init_from_llmc "$tmp/m.bin" --hidden_dim 64
head -c 5000 "$tmp/m.bin" >"$tmp/short.bin"
expect_error "$tmp/short.bin: the header" "${cfg[@]}" --init_from_llmc "$tmp/short.bin"
expect_error "(truncated)" "${cfg[@]}" --init_from_llmc "$tmp/short.bin"
expect_error "--save_llmc writes llm.c's GPT-2 layout" "${cfg[@]}" --hidden_dim $C --num_heads $H --save_llmc "$tmp/x.bin"
expect_error "no tensor 'transformer.h.2.attn.c_attn.weight'" "${cfg[@]}" --model gpt2 --hidden_dim $C --num_heads $H \
  --num_layers 3 --max_seq_len 16 --init_from_hf "$tmp/m2.safetensors"
expect_error "--gpt2_size: d13 not in" "${cfg[@]}" -e d13
expect_error "cutrain.data_order \"llmc\": llm.c's batches take the following token as the label: expected next-token labels" \
  "${cfg[@]}" "${size[@]}" --labels identity
python3 - "$tmp/tiny.bin" <<'PY'
import struct, sys
h = [0] * 256; h[0], h[1], h[2] = 20240520, 1, 32
open(sys.argv[1], "wb").write(struct.pack("256i", *h) + struct.pack("32H", *range(32)))
PY
expect_error "shard $tmp/tiny.bin holds 32 tokens; llm.c's data order needs at least world_size x B x T + 1 = 33" \
  "${cfg[@]}" "${size[@]}" --data_order llmc --data "$tmp/tiny.bin"
if "$bin" train --device "$device" "${cfg[@]}" "${size[@]}" --seq_length 16 --batch_size 2 --data_order llmc >"$tmp/e.txt" 2>&1; then
  fail "accepted --data_order without --use_real_data"
fi
grep -qF -- "--data_order llmc: the data order orders the token shards' batches: expected --use_real_data with it" "$tmp/e.txt" \
  || { cat "$tmp/e.txt"; fail "--data_order without --use_real_data: no named error"; }
expect_error "--num_layers 4 contradicts --gpt2_size d12 (12)" "${cfg[@]}" -e d12 --num_layers 4
echo "gpt2_cli ($device): ok"
