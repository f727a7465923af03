"""Peers of bench/bench_moe.cu's layer rows: DeepSpeed's deepspeed.moe.layer.MoE (ep_size=1, k=1/2,
capacity_factor 1, min_capacity 4, token dropping, no noise, no random token selection, no 2nd-expert
sampling: the semantics of cutrain's layer) and a plain PyTorch MoE (softmax top-k routing without
capacity, each expert's rows by index, weighted index_add), both bf16 with the same bias-free
expert FFN (Linear(H, F) -> GELU -> Linear(F, H)), forward and forward+backward (incl. the aux loss
at coefficient 0.01), at hidden 1024, FFN 4096, 8192 tokens, 8 and 64 experts.

Names: "moe/<fwd|fwd_bwd>/T8192_H1024_F4096_E<E>_k<k>@deepspeed" and "...@torch"; DeepSpeed's
use_residual=True (PR-MoE) at top-1 as "moe/fwd_bwd/..._k1_residual@deepspeed". Run DeepSpeed's
rows through ../shared/peers/run.sh ds-python (it installs DeepSpeed); without DeepSpeed only the
plain PyTorch rows are written."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_util  # noqa: E402

T, H, FF = 8192, 1024, 4096
AUX_COEF = 0.01


def expert_ffn():
    return nn.Sequential(nn.Linear(H, FF, bias=False), nn.GELU(), nn.Linear(FF, H, bias=False))


class TorchMoE(nn.Module):
    """Top-k softmax routing, every route computed (no capacity), the load-balancing loss."""

    def __init__(self, experts, k):
        super().__init__()
        self.k = k
        self.wg = nn.Linear(H, experts, bias=False)
        self.experts = nn.ModuleList(expert_ffn() for _ in range(experts))

    def forward(self, x):
        logits = F.linear(x.float(), self.wg.weight.float())
        gates = F.softmax(logits, dim=1)
        top_p, top_e = torch.topk(gates, self.k, dim=1)
        if self.k > 1:
            top_p = top_p / top_p.sum(dim=1, keepdim=True)
        e1 = F.one_hot(top_e[:, 0], gates.shape[1]).float()
        l_aux = (gates.mean(0) * e1.mean(0)).sum() * gates.shape[1]
        out = torch.zeros_like(x)
        flat_e = top_e.reshape(-1)
        flat_p = top_p.reshape(-1)
        tok = torch.arange(x.shape[0], device=x.device).repeat_interleave(self.k)
        order = torch.argsort(flat_e, stable=True)
        counts = torch.bincount(flat_e, minlength=len(self.experts)).tolist()
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            idx = order[start:start + n]
            start += n
            rows = tok[idx]
            y = self.experts[e](x.index_select(0, rows))
            out = out.index_add(0, rows, (y.float() * flat_p[idx, None]).to(x.dtype))
        return out, l_aux


def fwd_bwd_once(module, x, dy):
    module.zero_grad(set_to_none=True)
    x.grad = None
    out, l_aux = module(x)[:2]
    torch.autograd.backward([out, l_aux], [dy, torch.tensor(AUX_COEF, device=x.device, dtype=l_aux.dtype)])


def timed_rows(res, name, module, x, dy):
    def fwd():
        with torch.no_grad():
            module(x)

    res.add(name.replace("{dir}", "fwd"), peer_util.time_us(fwd, iters=res.iters))
    res.add(name.replace("{dir}", "fwd_bwd"), peer_util.time_us(lambda: fwd_bwd_once(module, x, dy), iters=res.iters))


def main():
    res = peer_util.Results("PyTorch / DeepSpeed peers of bench_moe's layer rows")
    res.iters = min(res.iters, 20)
    try:
        import deepspeed
        from deepspeed.moe.layer import MoE
        deepspeed.init_distributed(dist_backend="nccl", verbose=False)
    except Exception as e:  # noqa: BLE001 (any failure to bring DeepSpeed up leaves only the torch rows)
        print(f"moe_peer: DeepSpeed unavailable ({e}); plain PyTorch rows only", file=sys.stderr)
        MoE = None
    torch.manual_seed(0)
    x = (torch.rand(T, H, device="cuda") * 2 - 1).to(torch.bfloat16).requires_grad_(True)
    dy = (torch.rand(T, H, device="cuda") * 2 - 1).to(torch.bfloat16)
    for E in (8, 64):
        for k in (1, 2):
            sh = f"T{T}_H{H}_F{FF}_E{E}_k{k}"
            if MoE is not None:
                m = MoE(hidden_size=H, expert=expert_ffn(), num_experts=E, ep_size=1, k=k, capacity_factor=1.0,
                        eval_capacity_factor=1.0, min_capacity=4, noisy_gate_policy=None, drop_tokens=True,
                        use_rts=False, top2_2nd_expert_sampling=False)
                m.set_deepspeed_parallelism()
                m = m.cuda().to(torch.bfloat16)
                timed_rows(res, f"moe/{{dir}}/{sh}@deepspeed", m, x, dy)
                del m
            if MoE is not None and k == 1:  # PR-MoE's residual variant (bench_moe's *_residual rows)
                m = MoE(hidden_size=H, expert=expert_ffn(), num_experts=E, ep_size=1, k=1, capacity_factor=1.0,
                        eval_capacity_factor=1.0, min_capacity=4, use_residual=True, noisy_gate_policy=None,
                        drop_tokens=True, use_rts=False, top2_2nd_expert_sampling=False)
                m.set_deepspeed_parallelism()
                m = m.cuda().to(torch.bfloat16)
                name = f"moe/fwd_bwd/{sh}_residual@deepspeed"
                res.add(name, peer_util.time_us(lambda: fwd_bwd_once(m, x, dy), iters=res.iters))
                del m
            t = TorchMoE(E, k).cuda().to(torch.bfloat16)
            timed_rows(res, f"moe/{{dir}}/{sh}@torch", t, x, dy)
            del t
            torch.cuda.empty_cache()
    res.write()


if __name__ == "__main__":
    main()
