"""PyTorch peer of `cutrain train`: the BF16 example's SimpleTransformerModel (post-LN blocks with
nn.MultiheadAttention, exact GELU, untied output projection), the same random data and the three
precision layouts done by hand (no DeepSpeed): baseline = bf16 params/grads + fp32 master + fp32
moments; bf16_master_wg = bf16 params are the master, fp32 moments; bf16_full = bf16 moments too.
Prints the same SUMMARY line as train.py / cutrain. Eager by default, --compile for torch.compile.

  python3 bench/peers/train_peer.py --deepspeed_config configs/bf16_full.json [--compile] [model flags]
  python3 bench/peers/train_peer.py --out results.json    # all layouts eager, bf16_full compiled (gpu-check)
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.utils.checkpoint


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.attention = nn.MultiheadAttention(h, heads, batch_first=True)
        self.norm1 = nn.LayerNorm(h)
        self.ff = nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h))
        self.norm2 = nn.LayerNorm(h)

    def forward(self, x):
        x = self.norm1(x + self.attention(x, x, x, need_weights=False)[0])
        return self.norm2(x + self.ff(x))


class SimpleTransformerModel(nn.Module):
    def __init__(self, vocab, h, layers, heads, max_seq):
        super().__init__()
        self.embedding = nn.Embedding(vocab, h)
        self.pos_embedding = nn.Embedding(max_seq, h)
        self.layers = nn.ModuleList(Block(h, heads) for _ in range(layers))
        self.output_proj = nn.Linear(h, vocab)
        self.checkpointing = False

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.embedding(ids) + self.pos_embedding(pos)
        for blk in self.layers:
            if self.checkpointing:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return self.output_proj(x)


def layout_of(config):
    bf16 = config.get("bf16", {})
    if bf16.get("bf16_optimizer_states"):
        return "bf16_full"
    if bf16.get("bf16_master_weights_and_grads"):
        return "bf16_master_wg"
    return "baseline"


class HandAdamW:
    """AdamW over the model's bf16 params with the layout's master/moment dtypes."""

    def __init__(self, params, layout, lr, betas, eps, wd):
        self.params = [p for p in params]
        self.layout, self.lr, self.b1, self.b2, self.eps, self.wd = layout, lr, betas[0], betas[1], eps, wd
        mdt = torch.bfloat16 if layout == "bf16_full" else torch.float32
        self.master = [p.detach().float() for p in self.params] if layout == "baseline" else None
        self.m = [torch.zeros_like(p, dtype=mdt) for p in self.params]
        self.v = [torch.zeros_like(p, dtype=mdt) for p in self.params]
        self.t = 0

    @torch.no_grad()
    def step(self):
        self.t += 1
        bc1, bc2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for i, p in enumerate(self.params):
            g = p.grad.float()
            w = self.master[i] if self.master is not None else p.float()
            m = self.m[i].float().mul_(self.b1).add_(g, alpha=1 - self.b1)
            v = self.v[i].float().mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
            w.mul_(1 - self.lr * self.wd).addcdiv_(m / bc1, (v / bc2).sqrt_().add_(self.eps), value=-self.lr)
            self.m[i].copy_(m)
            self.v[i].copy_(v)
            p.copy_(w)
            p.grad = None


def run(args, config_path, compile_model):
    config = json.load(open(config_path))
    layout = layout_of(config)
    opt = config.get("optimizer", {}).get("params", {})
    torch.manual_seed(args.seed)
    torch.cuda.reset_peak_memory_stats()
    model = SimpleTransformerModel(args.vocab_size, args.hidden_dim, args.num_layers, args.num_heads,
                                   args.seq_length).cuda().to(torch.bfloat16)
    model.checkpointing = args.activation_checkpointing
    n = sum(p.numel() for p in model.parameters())
    print(f"[Rank 0] Model parameters: {n:,} total, {n:,} trainable")
    optim = HandAdamW(model.parameters(), layout, args.learning_rate or opt.get("lr", 1e-4),
                      opt.get("betas", [0.9, 0.999]), opt.get("eps", 1e-8), opt.get("weight_decay", 0.0))
    fwd = torch.compile(model) if compile_model else model
    loss_fn = nn.CrossEntropyLoss()
    mib = lambda b: f"{b / 1024 ** 3:.2f} GB"
    print(f"[Rank 0] Memory after init: allocated={mib(torch.cuda.memory_allocated())}, "
          f"reserved={mib(torch.cuda.memory_reserved())}")
    times, losses = [], []
    for step in range(args.num_steps):
        t0 = time.time()
        ids = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_length), device="cuda")
        labels = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_length), device="cuda")
        logits = fwd(ids)
        loss = loss_fn(logits.view(-1, args.vocab_size).float(), labels.view(-1))
        loss.backward()
        optim.step()
        lv = loss.item()
        dt = time.time() - t0
        if step >= args.warmup_steps:
            times.append(dt)
        losses.append(lv)
        if step % args.log_interval == 0 or step == args.num_steps - 1:
            print(f"[Rank 0] Step {step}: loss={lv:.4f}, time={dt:.3f}s, alloc_mem={mib(torch.cuda.memory_allocated())}, "
                  f"peak_mem={mib(torch.cuda.max_memory_allocated())}")
    avg = sum(times) / len(times) if times else 0.0
    tag = config_path + ("@compile" if compile_model else "@eager")
    print(f"SUMMARY: config={tag} params={n} peak_mem_bytes={torch.cuda.max_memory_allocated()} "
          f"alloc_mem_bytes={torch.cuda.memory_allocated()} avg_step_time={avg:.4f}")
    if args.loss_log_file:
        with open(args.loss_log_file, "w") as f:
            f.write("step,loss\n" + "".join(f"{i},{l}\n" for i, l in enumerate(losses)))
    del model, fwd, optim
    torch.cuda.empty_cache()
    return layout, avg


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deepspeed_config")
    p.add_argument("--hidden_dim", type=int, default=1024)
    p.add_argument("--num_layers", type=int, default=12)
    p.add_argument("--num_heads", type=int, default=16)
    p.add_argument("--vocab_size", type=int, default=50000)
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--seq_length", type=int, default=512)
    p.add_argument("--num_steps", type=int, default=20)
    p.add_argument("--warmup_steps", type=int, default=5)
    p.add_argument("--learning_rate", type=float, default=None)
    p.add_argument("--log_interval", type=int, default=5)
    p.add_argument("--activation_checkpointing", action="store_true")
    p.add_argument("--loss_log_file")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--out", help="run every layout eager and compiled, write JSON results here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("peer: no CUDA device", file=sys.stderr)
        sys.exit(2)
    if args.out is None:
        if not args.deepspeed_config:
            p.error("--deepspeed_config is required (or --out for the full sweep)")
        run(args, args.deepspeed_config, args.compile)
        return
    shape = f"h{args.hidden_dim}_l{args.num_layers}_b{args.batch_size}_s{args.seq_length}"
    rows = []
    # Eager for every layout, torch.compile for bf16_full only (gpu-check gives a peer 300 s).
    runs = [(c, False) for c in ("configs/baseline.json", "configs/bf16_master_wg.json", "configs/bf16_full.json")]
    runs.append(("configs/bf16_full.json", True))
    for cfg, comp in runs:
        try:
            layout, avg = run(args, cfg, comp)
        except Exception as e:  # keep the other rows
            print(f"peer: {cfg} {'compile' if comp else 'eager'} failed: {e}", file=sys.stderr)
            continue
        rows.append({"name": f"train/step/{shape}_{layout}" + ("@compile" if comp else ""), "time_us": avg * 1e6})
    json.dump({"device": torch.cuda.get_device_name(0), "results": rows}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
