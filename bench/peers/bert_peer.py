#!/usr/bin/env python3
"""PyTorch peer of cutrain's BERT-Large pre-training (issue #20): the same Pre-LN layer stack in plain
PyTorch, run on the device in the same call as `cutrain train --model bert`.

The model: word + position embeddings (vocabulary 50304 = GPT-2's 50257 + [MASK] 50257 + [PAD]
50258, padded to a multiple of 128; 512 positions), LayerNorm, dropout 0.1; 24 x
nn.TransformerEncoderLayer(d_model 1024, nhead 16, dim_feedforward 4096, dropout 0.1, GELU,
batch_first, norm_first=True: Pre-LN; its nn.MultiheadAttention calls SDPA) and a final LayerNorm;
the masked-LM head dense + GELU + LayerNorm + decoder tied to the word embedding + bias. LayerNorm eps
1e-12 (DeepSpeedTransformerConfig's BERT value), weights N(0, 0.02). The head runs on the masked
positions only (as DeepSpeed's bing_bert gathers them), cross-entropy over them; the key padding mask
(src_key_padding_mask) comes from each sequence's length.

The data (seeded, generated before the timed steps): per sequence a length uniform in [S/2, S] (the
synthetic-sample rule of data/mlm_sampler.h), random real tokens, [PAD] beyond the length; 15% of the
real tokens (rounded half up, at least 1, at most --max_predictions: bing_bert's 20 at seq 128, 80 at
512) chosen as targets, 80% of them -> [MASK], 10% a random token, 10% kept. The gathered target list
has a fixed length B * max_predictions (unused entries: label -100), so torch.compile sees one shape.
Draws are torch's generator, not data/mlm_masking.h's SplitMix64: the same distribution, not the
same tokens.

Variants: {fp16 autocast + GradScaler, bf16 autocast} x {eager, torch.compile}; fp32 parameters;
optimizer torch.optim.AdamW(fused=True). PyTorch has no LAMB, so the peer's optimizer step is
AdamW's (cutrain's BERT configs use DeepSpeed's Lamb): the JSON and every table say so.

Modes:
  --mode step      full training step (forward, loss, backward, scaler, optimizer, zero_grad) at
                   --batch x --seq: warm-up, then CUDA events around each of --steps steps; the
                   median step ms, samples/s = batch / median, peak memory (max_memory_allocated
                   over the timed steps)
  --mode layer     one encoder layer's forward + backward alone at --batch x --seq (fp32 residual
                   input, as the stack's residual stream is under autocast), median of --steps
  --mode maxbatch  the largest micro-batch at --seq (default 512) whose step fits under
                   --mem_cap_gb GB: the allocator is capped there (set_per_process_memory_fraction)
                   and a batch fits when its steps run without OOM and their peak stays under the
                   cap; doubling from 1, then bisection

  python3 bench/peers/bert_peer.py --mode step --seq 128 --batch 64 --json /tmp/bert_s128.json
  python3 bench/peers/bert_peer.py --mode layer --seq 512 --batch 16 --dtype bf16 --exec compile
  python3 bench/peers/bert_peer.py --mode maxbatch --mem_cap_gb 40 --exec eager

Rows (JSON "results", one per variant): name "bert/step/b64_s128_fp16", "bert/layer/b16_s512_bf16",
"bert/maxbatch/s512_cap40g_fp16", suffixed "@compile" for torch.compile ("@compile_layers" with
--compile_scope layers); time_us (the median), samples_per_s, tokens_per_s (real tokens),
peak_mem_bytes; maxbatch rows add micro_batch and the trials. A variant that fails gets a row with
"error" and the others still run.
"""
import argparse
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

GPT2_VOCAB = 50257          # real tokens are below it
MASK_ID, PAD_ID = 50257, 50258
OPTIMIZER_NOTE = ("torch.optim.AdamW(fused=True), lr 1e-4, betas (0.9, 0.999), eps 1e-6, weight decay 0.01: "
                  "PyTorch has no LAMB (cutrain's BERT configs use DeepSpeed's Lamb)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--mode", choices=("step", "layer", "maxbatch"), default="step")
    p.add_argument("--seq", type=int, default=None, help="sequence length S (default 128; 512 for maxbatch)")
    p.add_argument("--batch", type=int, default=None,
                   help="micro-batch (default 64 at seq <= 128, else 16; ignored by maxbatch)")
    p.add_argument("--dtype", default="fp16,bf16", help="comma list of fp16 (autocast + GradScaler), bf16 (autocast)")
    p.add_argument("--exec", dest="execs", default="eager,compile", help="comma list of eager, compile")
    p.add_argument("--compile_scope", choices=("model", "layers"), default="model",
                   help="compile: the whole model (default), or each encoder layer alone (regional "
                        "compilation: one compile shared by the 24 layers, no fusion across them)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (step, layer) per variant")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    p.add_argument("--mem_cap_gb", type=float, default=None, help="maxbatch: the memory cap in GB (1e9 bytes)")
    p.add_argument("--max_batch", type=int, default=1024, help="maxbatch: stop doubling here")
    p.add_argument("--trial_steps", type=int, default=3, help="maxbatch: steps run per trial batch")
    p.add_argument("--max_predictions", type=int, default=None,
                   help="masked positions per sequence at most (default 20 at seq <= 128, else 80)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--intermediate", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--max_pos", type=int, default=512)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--ln_eps", type=float, default=1e-12)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default="cuda", help="cuda, or cpu (a small check of the script, not a peer)")
    p.add_argument("--json", "--out", dest="json", default=None, help="write the results as JSON here")
    a = p.parse_args(argv)
    # Refuse bad input before any work, naming the flag.
    if a.seq is None:
        a.seq = 512 if a.mode == "maxbatch" else 128
    if a.batch is None:
        a.batch = 64 if a.seq <= 128 else 16
    if a.max_predictions is None:
        a.max_predictions = 20 if a.seq <= 128 else 80
    a.dtypes = [d for d in a.dtype.split(",") if d]
    a.exec_list = [e for e in a.execs.split(",") if e]
    for d in a.dtypes:
        if d not in ("fp16", "bf16"):
            p.error(f"--dtype: expected fp16 or bf16, got {d!r}")
    for e in a.exec_list:
        if e not in ("eager", "compile"):
            p.error(f"--exec: expected eager or compile, got {e!r}")
    if not a.dtypes or not a.exec_list:
        p.error("--dtype and --exec need at least one value each")
    if not 1 <= a.seq <= a.max_pos:
        p.error(f"--seq must be in [1, --max_pos={a.max_pos}], got {a.seq}")
    if a.batch < 1 or a.steps < 1 or a.warmup < 0 or a.trial_steps < 1 or a.max_batch < 1:
        p.error("--batch, --steps, --trial_steps and --max_batch must be >= 1, --warmup >= 0")
    if a.hidden % a.heads:
        p.error(f"--hidden ({a.hidden}) must be a multiple of --heads ({a.heads})")
    if a.vocab <= PAD_ID:
        p.error(f"--vocab must exceed [PAD] = {PAD_ID}, got {a.vocab}")
    if a.max_predictions < 1:
        p.error(f"--max_predictions must be >= 1, got {a.max_predictions}")
    if a.mode == "maxbatch" and (a.mem_cap_gb is None or a.mem_cap_gb <= 0):
        p.error("--mode maxbatch needs --mem_cap_gb > 0")
    return a


def encoder_layer(a):
    return nn.TransformerEncoderLayer(d_model=a.hidden, nhead=a.heads, dim_feedforward=a.intermediate,
                                      dropout=a.dropout, activation="gelu", layer_norm_eps=a.ln_eps,
                                      batch_first=True, norm_first=True)


def init_weights(module, std=0.02):
    """BERT's init: matrices and embeddings N(0, std), biases 0, LayerNorms (1, 0)."""
    norms = {id(p) for m in module.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    with torch.no_grad():
        for p in module.parameters():
            if id(p) in norms:
                continue
            if p.dim() >= 2:
                p.normal_(0.0, std)
            else:
                p.zero_()


class BertMlm(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.word = nn.Embedding(a.vocab, a.hidden)
        self.pos = nn.Embedding(a.max_pos, a.hidden)
        self.emb_norm = nn.LayerNorm(a.hidden, eps=a.ln_eps)
        self.emb_drop = nn.Dropout(a.dropout)
        self.encoder = nn.TransformerEncoder(encoder_layer(a), a.layers, norm=nn.LayerNorm(a.hidden, eps=a.ln_eps),
                                             enable_nested_tensor=False)
        self.head_dense = nn.Linear(a.hidden, a.hidden)
        self.head_norm = nn.LayerNorm(a.hidden, eps=a.ln_eps)
        self.head_bias = nn.Parameter(torch.zeros(a.vocab))  # the decoder's weight is self.word.weight
        init_weights(self)

    def forward(self, ids, pad_mask, mlm_pos, mlm_labels):
        x = self.word(ids) + self.pos.weight[: ids.shape[1]]
        x = self.emb_drop(self.emb_norm(x))
        x = self.encoder(x, src_key_padding_mask=pad_mask)
        h = x.reshape(-1, x.shape[-1]).index_select(0, mlm_pos)
        h = self.head_norm(F.gelu(self.head_dense(h)))
        logits = F.linear(h, self.word.weight, self.head_bias)
        return F.cross_entropy(logits.float(), mlm_labels, ignore_index=-100)


def make_batch(B, S, max_pred, gen, device):
    """One masked-LM micro-batch (module docstring). Returns the model's inputs and the real-token count."""
    lo = max(1, S // 2)
    lengths = torch.randint(lo, S + 1, (B,), generator=gen)
    ids = torch.randint(0, GPT2_VOCAB, (B, S), generator=gen)
    pad = torch.arange(S)[None, :] >= lengths[:, None]
    ids[pad] = PAD_ID
    npred = torch.clamp((15 * lengths + 50) // 100, min=1, max=max_pred)
    pos = torch.arange(B)[:, None].mul(S).repeat(1, max_pred)  # unused entries: row start, label -100
    labels = torch.full((B, max_pred), -100, dtype=torch.long)
    for b in range(B):
        n = int(npred[b])
        chosen = torch.randperm(int(lengths[b]), generator=gen)[:n]
        labels[b, :n] = ids[b, chosen]
        pos[b, :n] += chosen
        r = torch.randint(0, 10, (n,), generator=gen)
        new = ids[b, chosen].clone()
        new[r < 8] = MASK_ID
        rnd = r == 8
        new[rnd] = torch.randint(0, GPT2_VOCAB, (int(rnd.sum()),), generator=gen)
        ids[b, chosen] = new
    inputs = (ids.to(device), pad.to(device), pos.reshape(-1).to(device), labels.reshape(-1).to(device))
    return inputs, int(lengths.sum())


class Precision:
    """fp16: autocast + GradScaler (dynamic loss scale); bf16: autocast, no scaler."""

    def __init__(self, name, device):
        self.name, self.device = name, device
        self.dtype = torch.float16 if name == "fp16" else torch.bfloat16
        self.scaler = torch.amp.GradScaler(device.type, enabled=name == "fp16")

    def autocast(self):
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_ms(fn, device):
    """Milliseconds of one fn() call: CUDA events on the GPU, the wall clock on the CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_bytes(device):
    return torch.cuda.max_memory_allocated() if device.type == "cuda" else 0


def release(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class Trainer:
    """The model, its optimizer and scaler for one variant; step() is one full training step."""

    def __init__(self, a, prec, compiled, device):
        torch.manual_seed(a.seed)
        self.model = BertMlm(a).to(device).train()
        self.fwd = self.model
        if compiled and a.compile_scope == "model":
            self.fwd = torch.compile(self.model)
        elif compiled:
            # Each layer is its own module: without room for one compile per layer, dynamo stops
            # recompiling after its limit (8) and the remaining layers run eagerly.
            cfg = torch._dynamo.config
            for k in ("recompile_limit", "cache_size_limit"):
                if hasattr(cfg, k):
                    setattr(cfg, k, max(getattr(cfg, k), 4 * len(self.model.encoder.layers)))
            for layer in self.model.encoder.layers:
                layer.compile()
        fused = device.type == "cuda"
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-6,
                                     weight_decay=0.01, fused=fused)
        self.prec = prec
        self.loss = None

    def step(self, inputs):
        with self.prec.autocast():
            loss = self.fwd(*inputs)
        self.prec.scaler.scale(loss).backward()
        self.prec.scaler.step(self.opt)
        self.prec.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        self.loss = loss.detach()


def variant_name(a, kind, shape, prec, compiled):
    name = f"bert/{kind}/{shape}_{prec}"
    if not compiled:
        return name
    return name + ("@compile_layers" if a.compile_scope == "layers" and kind != "layer" else "@compile")


def run_step(a, prec_name, compiled, device):
    prec = Precision(prec_name, device)
    t = Trainer(a, prec, compiled, device)
    gen = torch.Generator().manual_seed(a.seed)
    batches = [make_batch(a.batch, a.seq, a.max_predictions, gen, device) for _ in range(4)]
    for i in range(a.warmup):
        t.step(batches[i % len(batches)][0])
    sync(device)
    reset_peak(device)
    times = [timed_ms(lambda: t.step(batches[i % len(batches)][0]), device) for i in range(a.steps)]
    ms = statistics.median(times)
    tokens = statistics.mean(n for _, n in batches)
    row = {"time_us": ms * 1e3, "step_ms": ms, "samples_per_s": a.batch / (ms / 1e3),
           "tokens_per_s": tokens / (ms / 1e3), "peak_mem_bytes": peak_bytes(device),
           "loss": float(t.loss), "loss_scale": float(prec.scaler.get_scale()) if prec_name == "fp16" else None,
           "step_ms_min": min(times), "step_ms_max": max(times)}
    del t, batches
    return row


def run_layer(a, prec_name, compiled, device):
    prec = Precision(prec_name, device)
    torch.manual_seed(a.seed)
    layer = encoder_layer(a).to(device).train()
    init_weights(layer)
    f = torch.compile(layer) if compiled else layer
    gen = torch.Generator().manual_seed(a.seed)
    (_, pad, _, _), _ = make_batch(a.batch, a.seq, a.max_predictions, gen, device)
    x = torch.randn(a.batch, a.seq, a.hidden, device=device, requires_grad=True)
    dy = torch.randn(a.batch, a.seq, a.hidden, device=device)

    def fwd_bwd():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        with prec.autocast():
            y = f(x, src_key_padding_mask=pad)
        y.backward(dy)

    for _ in range(a.warmup):
        fwd_bwd()
    sync(device)
    reset_peak(device)
    times = [timed_ms(fwd_bwd, device) for _ in range(a.steps)]
    ms = statistics.median(times)
    row = {"time_us": ms * 1e3, "samples_per_s": a.batch / (ms / 1e3), "peak_mem_bytes": peak_bytes(device),
           "step_ms_min": min(times), "step_ms_max": max(times)}
    del layer, f, x, dy
    return row


def run_maxbatch(a, prec_name, compiled, device):
    cap = int(a.mem_cap_gb * 1e9)
    prec = Precision(prec_name, device)
    t = Trainer(a, prec, compiled, device)
    gen = torch.Generator().manual_seed(a.seed)
    trials = []

    def trial(B):  # a function of its own: its tensors are freed when it returns or raises
        inputs = [make_batch(B, a.seq, a.max_predictions, gen, device)[0] for _ in range(2)]
        reset_peak(device)
        for i in range(a.trial_steps):
            t.step(inputs[i % 2])
        sync(device)
        return peak_bytes(device)

    def fits(B):
        ok, peak, err = False, None, None
        try:
            peak = trial(B)
            ok = peak <= cap
        except torch.cuda.OutOfMemoryError:
            err = "OOM"
        if err:
            # An OOM inside scaler.step leaves the scaler mid-step: a fresh one at the same scale.
            old = t.prec.scaler
            t.prec.scaler = torch.amp.GradScaler(device.type, init_scale=old.get_scale() if old.is_enabled() else 1.0,
                                                 enabled=old.is_enabled())
        t.opt.zero_grad(set_to_none=True)
        t.loss = None
        release(device)
        trials.append({"micro_batch": B, "fits": ok, "peak_mem_bytes": peak, **({"error": err} if err else {})})
        print(f"  maxbatch {prec_name}{'@compile' if compiled else ''} B={B}: "
              f"{'fits' if ok else 'does not fit'}" + (f", peak {peak / 1e9:.2f} GB" if peak else f" ({err})"),
              flush=True)
        return ok

    good, bad, B = 0, None, 1
    while B <= a.max_batch:
        if not fits(B):
            bad = B
            break
        good, B = B, B * 2
    if bad is not None:
        while bad - good > 1:
            mid = (good + bad) // 2
            if fits(mid):
                good = mid
            else:
                bad = mid
    best = next((tr for tr in trials if tr["micro_batch"] == good and tr["fits"]), None)
    del t
    release(device)
    return {"time_us": None, "micro_batch": good, "mem_cap_bytes": cap,
            "peak_mem_bytes": best["peak_mem_bytes"] if best else None,
            "hit_max_batch": bad is None, "trials": trials}


def main(argv=None):
    a = parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("peer: no CUDA device", file=sys.stderr)
        sys.exit(2)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if a.mode == "maxbatch" and device.type == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        cap = a.mem_cap_gb * 1e9
        if cap > total:
            print(f"peer: --mem_cap_gb {a.mem_cap_gb} exceeds the device's {total / 1e9:.1f} GB", file=sys.stderr)
            sys.exit(2)
        torch.cuda.set_per_process_memory_fraction(cap / total)
    dev_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    doc = {"device": dev_name, "torch": torch.__version__, "optimizer": OPTIMIZER_NOTE,
           "config": {k: getattr(a, k) for k in ("mode", "seq", "batch", "layers", "hidden", "heads",
                                                 "intermediate", "vocab", "max_pos", "dropout", "ln_eps",
                                                 "max_predictions", "steps", "warmup", "mem_cap_gb", "compile_scope",
                                                 "seed")},
           "results": []}
    print(f"bert peer: {a.mode}, seq {a.seq}" + ("" if a.mode == "maxbatch" else f", micro-batch {a.batch}") +
          f", {a.layers} layers, hidden {a.hidden}, on {dev_name}, torch {torch.__version__}")
    print(f"optimizer: {OPTIMIZER_NOTE}", flush=True)
    runner = {"step": run_step, "layer": run_layer, "maxbatch": run_maxbatch}[a.mode]
    for prec_name in a.dtypes:
        for ex in a.exec_list:
            compiled = ex == "compile"
            if a.mode == "maxbatch":
                name = variant_name(a, "maxbatch", f"s{a.seq}_cap{a.mem_cap_gb:g}g", prec_name, compiled)
            else:
                name = variant_name(a, a.mode, f"b{a.batch}_s{a.seq}", prec_name, compiled)
            try:
                row = {"name": name, **runner(a, prec_name, compiled, device)}
            except Exception as e:  # keep the other variants
                print(f"peer: {name} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                row = {"name": name, "time_us": None, "error": f"{type(e).__name__}: {e}"}
            if compiled:
                torch._dynamo.reset()
            release(device)
            doc["results"].append(row)
            print(table_line(a.mode, row), flush=True)
            if a.json:  # after every variant: a run cut short keeps what it measured
                with open(a.json + ".tmp", "w") as f:
                    json.dump(doc, f, indent=1)
                os.replace(a.json + ".tmp", a.json)


def table_line(mode, row):
    name = f"{row['name']:42s}"
    if row.get("error"):
        return f"{name} error: {row['error']}"
    gb = f"{row['peak_mem_bytes'] / 1e9:7.2f} GB" if row.get("peak_mem_bytes") else "      - GB"
    if mode == "maxbatch":
        return f"{name} micro-batch {row['micro_batch']:5d}  peak {gb} (cap {row['mem_cap_bytes'] / 1e9:g} GB)"
    ms = row["time_us"] / 1e3
    return f"{name} {ms:9.2f} ms {row['samples_per_s']:9.1f} samples/s  peak {gb}"


if __name__ == "__main__":
    main()
