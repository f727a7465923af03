#!/usr/bin/env python3
"""Is cutrain's MoE layer DeepSpeed's? DeepSpeed's deepspeed.moe.layer.MoE (ep_size 1, noisy gate
policy None, use_rts False, no 2nd-expert sampling) run on the CPU in fp32 and fp64 over a set of
cases (top-1 / top-2, capacity factors whose fp32 capacity differs from the exact one, dropping or
not, the evaluation capacity, min_capacity winning, PR-MoE's residual MLP), written with its inputs
to a safetensors file; then cutrain's CPU reference (model/moe_reference.h) compares itself with
every case in tests/unit/test_moe_deepspeed.cpp (test_moe_deepspeed, which by default reads the
committed tests/data/moe_deepspeed_cases.safetensors that `--write_golden` writes).

What is compared, per case: the capacity, the experts' route counts before dropping, every route's
expert, slot and combine weight (which routes were dropped), the output, l_aux, and the gradients
of loss = sum(out * R) + coeff * l_aux for a fixed random R (input, gate weight, every expert's fc1
and fc2, PR-MoE's MLP and coefficient), and the gradients of l_aux alone (input, gate weight).

Top-1 with token dropping is run twice on the same inputs. DeepSpeed's use_rts=False keeps, of an
expert over capacity, the routes `torch.topk` returns for the top `capacity` entries of a 0/1 mask:
equal values, whose order torch leaves unspecified (on the CPU neither the first nor the last tokens).
cutrain keeps the first `capacity` routes in token order (top-2's rule in DeepSpeed). So the
`topk` run checks only what does not depend on that choice (capacity, counts, kept routes per expert,
the experts of the routes both keep) and lists the routes the two keep differently; the `first` run
drives DeepSpeed's own random-token-selection path with selection keys that fall with the token
index (use_rts=True, `exp_selection_uniform_map` replaced), so DeepSpeed keeps the first routes in
token order, and compares everything.

DeepSpeed computes the gate in fp32 whatever the model's dtype, the reference in fp64: those runs
agree to fp32 rounding (the test allows 1e-3). Each fp64 case of 2^n tokens runs once more with
DeepSpeed's top1gating / top2gating on fp64 logits (`gate64`: TopKGate.forward without its casts;
its fp32 ce = count / tokens is exact at 2^n tokens): agreement to fp64 rounding (allowed 1e-11).

Needs torch and deepspeed==0.19.8 (CPU is enough; a throw-away venv, not a cutrain dependency):
    python3 -m venv /tmp/ds-venv && /tmp/ds-venv/bin/pip install torch deepspeed==0.19.8
    cmake --build build/release --target test_moe_deepspeed
    /tmp/ds-venv/bin/python bench/peers/moe_cpu_check.py [--bin build/release/tests/test_moe_deepspeed]
        [--seed N] [--out FILE] [--write_golden]
Without --write_golden the cases use fresh inputs (--seed, default random) and go to --out (default
build/moe_cpu_check.safetensors); --write_golden uses seed 0 and writes the committed golden file.
Exit: the test binary's status; 2 when torch / deepspeed / the binary are missing (said why).
"""
import argparse
import json
import os
import random
import socket
import struct
import subprocess
import sys
import types

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
GOLDEN = os.path.join(ROOT, "tests", "data", "moe_deepspeed_cases.safetensors")
DS_VERSION = "0.19.8"
H, FFN = 8, 32  # F = 4H, the experts of both cutrain architectures (small: the golden file is committed)

# name, dtype, k, experts, tokens, capacity_factor, eval_capacity_factor, train, min_capacity, drop, residual.
# The cf1.1 / cf1.2 / cf0.3 shapes are ones where DeepSpeed's capacity, computed in fp32, differs
# from ceil(k * tokens / experts * factor) in double: 100/2 * 1.1 -> 55 (double: 56), 70/6 * 1.2 -> 15
# (double: 14), 50/4 * 2.4 -> 31 (double: 30), 70/6 * 0.6 -> 8 (double: 7).
CASES = [
    ("top1_fp64", "fp64", 1, 4, 32, 1.0, 1.0, True, 4, True, False),
    ("top1_fp32_cf1.25", "fp32", 1, 8, 64, 1.25, 1.0, True, 4, True, False),
    ("top1_fp64_cf1.1", "fp64", 1, 2, 100, 1.1, 1.0, True, 4, True, False),
    ("top1_fp32_cf1.2", "fp32", 1, 6, 70, 1.2, 1.0, True, 4, True, False),
    ("top1_fp64_min_capacity", "fp64", 1, 4, 32, 0.25, 1.0, True, 6, True, False),
    ("top1_fp64_eval_cf2", "fp64", 1, 4, 32, 0.5, 2.0, False, 4, True, False),
    ("top1_fp64_no_drop", "fp64", 1, 4, 32, 1.0, 1.0, True, 4, False, False),
    ("top1_fp64_residual", "fp64", 1, 4, 64, 1.0, 1.0, True, 4, True, True),
    ("top2_fp64", "fp64", 2, 4, 32, 1.0, 1.0, True, 4, True, False),
    ("top2_fp32_cf0.75", "fp32", 2, 8, 50, 0.75, 1.0, True, 4, True, False),
    ("top2_fp64_cf1.2", "fp64", 2, 4, 50, 1.2, 1.0, True, 4, True, False),
    ("top2_fp64_cf0.3", "fp64", 2, 6, 70, 0.3, 1.0, True, 1, True, False),  # many tokens lose both routes
    ("top2_fp64_no_drop", "fp64", 2, 4, 32, 1.0, 1.0, True, 4, False, False),
    ("top2_fp64_residual", "fp64", 2, 4, 64, 1.0, 1.0, True, 4, True, True),
]
INPUTS = ("x", "R", "wg", "w1", "w2", "r1", "r2", "cw", "cb")
ROUTING = ("capacity", "exp_counts", "route_expert", "route_slot", "route_weight", "l_aux")
AUX_COEFF = 0.37  # large enough that the aux loss's share of the gate gradient shows
MIN_GAP = 1e-4    # fp64 logit margins below this are redrawn: fp32 gating must not reorder them


def die(msg):
    sys.stderr.write(f"moe_cpu_check: {msg}\n")
    raise SystemExit(2)


def bring_up():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import torch  # noqa: F401
        import deepspeed
    except ImportError as e:
        die(f"needs torch and deepspeed=={DS_VERSION} ({e}); e.g. python3 -m venv /tmp/ds-venv && "
            f"/tmp/ds-venv/bin/pip install torch deepspeed=={DS_VERSION}, then run this script with /tmp/ds-venv/bin/python")
    if deepspeed.__version__ != DS_VERSION:
        print(f"moe_cpu_check: deepspeed {deepspeed.__version__}, the cases were designed on {DS_VERSION}", file=sys.stderr)
    # One process, gloo: DeepSpeed's expert groups need an initialized process group even at ep_size 1.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", str(port))):
        os.environ.setdefault(k, v)
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)


def make_expert(torch):
    class Expert(torch.nn.Module):
        """cutrain's expert: bias-free fc1 -> erf GELU -> fc2."""

        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(H, FFN, bias=False)
            self.act = torch.nn.GELU()
            self.fc2 = torch.nn.Linear(FFN, H, bias=False)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    return Expert()


def usable(torch, x, wg, k):
    """Inputs whose routing fp32 gating cannot reorder (every fp64 logit margin between a route and
    the next above MIN_GAP) and whose route-0 counts are not all equal (there the aux loss's
    gradient is zero in exact arithmetic, and both sides' rounding noise would be compared)."""
    logits = x.double() @ wg.double().t()
    top = torch.sort(logits, dim=1, descending=True).values
    gaps = [top[:, 0] - top[:, 1]] + ([top[:, 1] - top[:, 2]] if k == 2 else [])
    counts = torch.bincount(logits.argmax(dim=1), minlength=wg.shape[0])
    return min(float(g.min()) for g in gaps) > MIN_GAP and int(counts.min()) != int(counts.max())


def fp64_gate_forward(self, input, used_token=None, sparse_routes=False, use_tutel=False):
    """TopKGate.forward without its casts to fp32: DeepSpeed's own top1gating / top2gating on the
    model dtype's logits (noise-free, ep_size 1), so an fp64 model's routing arithmetic is fp64."""
    from deepspeed.moe import sharded_moe
    import torch
    logits = torch.nn.functional.linear(input, weight=self.wg.weight, bias=None)
    cf = self.capacity_factor if self.training else self.eval_capacity_factor
    if self.k == 1:
        return sharded_moe.top1gating(logits, cf, self.min_capacity, used_token, None, self.drop_tokens, self.use_rts,
                                      self.ep_group, sparse_routes, use_tutel)
    # top2gating's einsums pair the gates with mask.float(): the 0/1 masks go to fp64 (exactly) here.
    einsum = sharded_moe.einsum
    sharded_moe.einsum = lambda rule, a, b: einsum(rule, a.to(logits.dtype), b.to(logits.dtype))
    try:
        return sharded_moe.top2gating(logits, cf, self.min_capacity, self.drop_tokens, self.ep_group,
                                      self.top2_2nd_expert_sampling, sparse_routes)
    finally:
        sharded_moe.einsum = einsum


def run_case(torch, case, seed, selection, gate64=False):
    from deepspeed.moe import sharded_moe
    from deepspeed.moe.layer import MoE
    name, dtype_name, k, E, T, cf, ecf, train, min_cap, drop, residual = case
    dtype = torch.float64 if dtype_name == "fp64" else torch.float32
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, sd=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * sd).to(dtype)

    m = MoE(hidden_size=H, expert=make_expert(torch), num_experts=E, ep_size=1, k=k, capacity_factor=cf,
            eval_capacity_factor=ecf, min_capacity=min_cap, use_residual=residual, noisy_gate_policy=None,
            drop_tokens=drop, use_rts=selection == "first", top2_2nd_expert_sampling=False)
    m.set_deepspeed_parallelism()
    m = m.to(dtype)
    m.train(train)
    dm = m.deepspeed_moe
    wg = dm.gate.wg.weight
    experts = dm.experts.deepspeed_experts
    with torch.no_grad():
        wg.copy_(randn(E, H, sd=1.5 / H ** 0.5))
        for ex in experts:
            ex.fc1.weight.copy_(randn(FFN, H, sd=1 / H ** 0.5))
            ex.fc2.weight.copy_(randn(H, FFN, sd=1 / FFN ** 0.5))
        if residual:
            m.mlp.fc1.weight.copy_(randn(FFN, H, sd=1 / H ** 0.5))
            m.mlp.fc2.weight.copy_(randn(H, FFN, sd=1 / FFN ** 0.5))
            m.coefficient.weight.copy_(randn(2, H, sd=1 / H ** 0.5))
            m.coefficient.bias.copy_(randn(2, sd=0.5))
    for _ in range(100):
        x = randn(T, H)
        if usable(torch, x, wg.detach(), k):
            break
    else:
        die(f"{name}: no input with routing margins above {MIN_GAP} and unequal loads in 100 draws")
    if gate64:
        dm.gate.forward = types.MethodType(fp64_gate_forward, dm.gate)
    R = randn(T, H)

    if selection == "first":  # DeepSpeed's RTS keeps the largest keys: falling with the token index
        keys = torch.linspace(1.0, 1.0 / T, T, dtype=torch.float32).unsqueeze(1)
        sharded_moe.exp_selection_uniform_map[torch.device("cpu")] = lambda shape: keys.expand(*shape).contiguous()
    got = {}
    hook = dm.gate.register_forward_hook(lambda mod, inp, out: got.update(gate=out))
    xg = x.clone().requires_grad_(True)
    out, l_aux, exp_counts = m(xg)
    hook.remove()
    sharded_moe.exp_selection_uniform_map.clear()
    _, capacity, _, indices, locations, gates, _ = got["gate"]

    params = [xg, wg] + [ex.fc1.weight for ex in experts] + [ex.fc2.weight for ex in experts]
    if residual:
        params += [m.mlp.fc1.weight, m.mlp.fc2.weight, m.coefficient.weight, m.coefficient.bias]
    loss = (out * R).sum() + AUX_COEFF * l_aux
    grads = torch.autograd.grad(loss, params, retain_graph=True)
    aux_grads = torch.autograd.grad(l_aux, [xg, wg])

    f64 = lambda t: t.detach().to(torch.float64).contiguous()  # noqa: E731
    i64 = lambda t: t.detach().to(torch.int64).contiguous()  # noqa: E731
    t = {"x": f64(x), "R": f64(R), "wg": f64(wg),
         "w1": f64(torch.stack([ex.fc1.weight for ex in experts])), "w2": f64(torch.stack([ex.fc2.weight for ex in experts])),
         "out": f64(out), "l_aux": f64(l_aux.reshape(1)), "capacity": i64(torch.as_tensor(capacity).reshape(1)),
         "exp_counts": i64(exp_counts), "route_expert": i64(indices), "route_slot": i64(locations),
         "route_weight": f64(gates), "dx": f64(grads[0]), "dwg": f64(grads[1]),
         "dw1": f64(torch.stack(grads[2:2 + E])), "dw2": f64(torch.stack(grads[2 + E:2 + 2 * E])),
         "aux_dx": f64(aux_grads[0]), "aux_dwg": f64(aux_grads[1])}
    if residual:
        t.update({"r1": f64(m.mlp.fc1.weight), "r2": f64(m.mlp.fc2.weight), "cw": f64(m.coefficient.weight),
                  "cb": f64(m.coefficient.bias), "dr1": f64(grads[-4]), "dr2": f64(grads[-3]), "dcw": f64(grads[-2]),
                  "dcb": f64(grads[-1])})
    meta = {"name": (name if selection == "native" else f"{name}.{selection}") + (".gate64" if gate64 else ""),
            "gate": "fp64" if gate64 else "fp32", "dtype": dtype_name, "tokens": T, "hidden": H, "ffn": FFN, "experts": E,
            "k": k, "capacity_factor": cf, "eval_capacity_factor": ecf, "train": train, "min_capacity": min_cap,
            "drop_tokens": drop, "use_residual": residual, "selection": selection, "aux_coeff": AUX_COEFF, "seed": seed}
    return meta, t


def write_safetensors(path, tensors, metadata):
    """The safetensors layout (8-byte header length, JSON header, data), every tensor 8-byte elements."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        data = t.numpy().tobytes()
        header[name] = {"dtype": "F64" if t.dtype.is_floating_point else "I64", "shape": list(t.shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "release", "tests", "test_moe_deepspeed"))
    ap.add_argument("--seed", type=int, default=None, help="default: random (0 with --write_golden)")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "moe_cpu_check.safetensors"))
    ap.add_argument("--write_golden", action="store_true", help=f"seed 0, written to {os.path.relpath(GOLDEN, ROOT)}")
    args = ap.parse_args()
    if args.write_golden:
        args.seed, args.out = 0 if args.seed is None else args.seed, GOLDEN
    elif args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    if not os.access(args.bin, os.X_OK):
        die(f"--bin: {args.bin} is not an executable (build it: cmake --build build/release --target test_moe_deepspeed)")
    bring_up()
    import deepspeed
    import torch

    tensors, metas = {}, []
    for i, case in enumerate(CASES):
        # Top-1 with dropping: DeepSpeed's own choice (topk) and the first routes in token order
        # (first); elsewhere there is no choice to make (native).
        # An fp64 case of 2^n tokens runs again with DeepSpeed's gating functions on fp64 logits
        # (gate64): the same semantics without fp32's rounding (its ce = mean(mask.float()), count /
        # tokens, stays fp32 but is exact at 2^n tokens), so a difference of 1e-12 would show.
        pow2 = case[4] & (case[4] - 1) == 0
        for sel in (["topk", "first"] if case[2] == 1 and case[9] else ["native"]):
            for gate64 in [False] + ([True] if case[1] == "fp64" and pow2 and sel != "topk" else []):
                meta, t = run_case(torch, case, args.seed * 1000 + i, sel, gate64)
                meta["inputs"] = case[0]  # every variant of a case has the same inputs, stored once
                for n in INPUTS:
                    if n in t:
                        v = tensors.setdefault(f"{case[0]}.{n}", t[n])
                        assert torch.equal(v, t[n]), f"{meta['name']}: input {n} differs between variants"
                metas.append(meta)
                # A topk run's numbers belong to routes cutrain does not keep: only its routing is kept.
                keep = ROUTING if sel == "topk" else [n for n in t if n not in INPUTS]
                tensors.update({f"{meta['name']}.{n}": t[n] for n in keep})
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_safetensors(args.out, tensors, {
        "cases": json.dumps(metas), "generator": "bench/peers/moe_cpu_check.py", "seed": str(args.seed),
        "torch": torch.__version__, "deepspeed": deepspeed.__version__})
    print(f"moe_cpu_check: {len(metas)} DeepSpeed {deepspeed.__version__} cases (torch {torch.__version__}, seed "
          f"{args.seed}) -> {os.path.relpath(args.out, ROOT)}", flush=True)
    env = dict(os.environ, CUTRAIN_MOE_DS_CASES=os.path.abspath(args.out))
    p = subprocess.run([args.bin, "--gtest_filter=MoeDeepSpeed.*"], env=env, cwd=ROOT)
    raise SystemExit(p.returncode)


if __name__ == "__main__":
    main()
