#!/usr/bin/env python3
"""Reference of `cutrain analyze-data` in plain Python: reads llm.c token shards itself, cuts the
batch sampler's windows (start every T tokens, T + 1 tokens with next-token labels, never across a
shard's end), computes each sample's metric (seqlen: T; vocabularyrarity: mean -log p(token) of the
T input tokens, p from the counts of every token of the shards), sorts the samples by it (ties by
id) and takes the nearest-rank percentiles; then compares with the index file cutrain wrote.

  curriculum_index_reference.py INDEX.json --metric M --seq_length T [--identity] SHARD...
Exit 0 when they agree (metric values to 1e-12 relative), 1 with the first difference otherwise.
"""
import argparse
import json
import math
import sys

from llmc_shard import read_shard


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("index")
    ap.add_argument("shards", nargs="+")
    ap.add_argument("--metric", required=True)
    ap.add_argument("--seq_length", type=int, required=True)
    ap.add_argument("--identity", action="store_true")
    a = ap.parse_args()
    T = a.seq_length
    L = T if a.identity else T + 1
    shards = [read_shard(p) for p in a.shards]
    total = sum(len(s) for s in shards)
    counts = {}
    for s in shards:
        for t in s:
            counts[t] = counts.get(t, 0) + 1
    neg_log_p = {t: -math.log(c / total) for t, c in counts.items()}
    values = []
    for s in shards:
        windows = (len(s) - L) // T + 1 if len(s) >= L else 0
        for w in range(windows):
            toks = s[w * T: w * T + T]
            if a.metric == "seqlen":
                values.append(float(T))
            else:
                acc = 0.0
                for t in toks:
                    acc += neg_log_p[t]
                values.append(acc / T)
    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    n = len(values)
    pct = [values[order[max(math.ceil(p * n / 100) - 1, 0)]] for p in range(101)]

    with open(a.index) as f:
        idx = json.load(f)
    problems = []
    if idx["metric"] != a.metric or idx["seq_len"] != T or idx["window_len"] != L:
        problems.append(f"header: {idx['metric']} T={idx['seq_len']} L={idx['window_len']}, expected {a.metric} T={T} L={L}")
    if idx["num_samples"] != n or len(idx["index_to_metric"]) != n:
        problems.append(f"num_samples {idx['num_samples']}, expected {n}")
    else:
        for i, (got, want) in enumerate(zip(idx["index_to_metric"], values)):
            if abs(got - want) > 1e-12 * max(1.0, abs(want)):
                problems.append(f"index_to_metric[{i}] = {got!r}, reference {want!r}")
                break
        if idx["index_to_sample"] != order:
            problems.append("index_to_sample differs from the reference order")
        for p in range(101):
            if abs(idx["percentiles"][p] - pct[p]) > 1e-12 * max(1.0, abs(pct[p])):
                problems.append(f"percentiles[{p}] = {idx['percentiles'][p]!r}, reference {pct[p]!r}")
                break
    if len(idx["shards"]) != len(a.shards) or any(
            s["bytes"] != 1024 + 2 * len(t) for s, t in zip(idx["shards"], shards)):
        problems.append("shard sizes in the fingerprint differ")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"reference agrees: {n} samples, {a.metric}, median {pct[50]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
