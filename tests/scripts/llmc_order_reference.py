#!/usr/bin/env python3
"""Reference of cutrain's llm.c data order (data/llmc_order.h) in plain Python, written from llm.c's
DataLoader as train_gpt2.cu uses it: its own MT19937 (Matsumoto and Nishimura's init_genrand,
twist and tempering), llm.c's permutation (Fisher-Yates from the top, j = next() % (i + 1)), the
shard order permuted in place at every epoch, a fresh permutation of a shard's samples each time
it is entered, (tokens - 1) // (world * B * T) samples per shard, sample i of rank r reading
B * T + 1 tokens from (i * world + r) * B * T.

  llmc_order_reference.py CASES.json     compare with the batches cutrain wrote
  llmc_order_reference.py --self-check   the generator against the published MT19937 values

CASES.json: a list of {"shards": [path...], "batch_size", "seq_len", "rank", "world_size", "seed",
"shuffle", "batches": [{"step", "inputs", "targets"}...]} (steps in any order). Exit 0 when every
batch agrees, 1 with the first difference.
"""
import json
import sys

from llmc_shard import read_shard

N, M = 624, 397


class MT19937:
    def __init__(self, seed):
        self.state = [seed & 0xFFFFFFFF]
        for i in range(1, N):
            prev = self.state[-1]
            self.state.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
        self.index = N

    def _twist(self):
        s = self.state
        for k in range(N):
            y = (s[k] & 0x80000000) | (s[(k + 1) % N] & 0x7FFFFFFF)
            s[k] = s[(k + M) % N] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
        self.index = 0

    def next(self):
        if self.index >= N:
            self._twist()
        y = self.state[self.index]
        self.index += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y


def permute(values, rng):
    for i in range(len(values) - 1, 0, -1):
        j = rng.next() % (i + 1)
        values[i], values[j] = values[j], values[i]


class Loader:
    """llm.c's DataLoader state machine: init, reset at each epoch, advance per shard."""

    def __init__(self, shards, B, T, rank, world, seed, shuffle):
        self.shards, self.B, self.T, self.rank, self.world = shards, B, T, rank, world
        self.shuffle = shuffle
        self.rng = MT19937(seed + rank)
        self.shard_indices = list(range(len(shards)))
        for s in shards:
            assert len(s) >= world * B * T + 1, "llm.c asserts every shard holds a batch"
        self.reset()

    def samples(self, file_index):
        return (len(self.shards[file_index]) - 1) // (self.world * self.B * self.T)

    def file(self):
        return self.shard_indices[self.current_shard] if self.shuffle else self.current_shard

    def enter(self):
        self.current_sample = 0
        if self.shuffle:
            self.intra = list(range(self.samples(self.file())))
            permute(self.intra, self.rng)

    def reset(self):
        self.current_shard = 0
        if self.shuffle:
            permute(self.shard_indices, self.rng)
        self.enter()

    def advance(self):
        if self.current_shard == len(self.shards) - 1:
            self.reset()
            return
        self.current_shard += 1
        self.enter()

    def next_batch(self):
        if self.current_sample >= self.samples(self.file()):
            self.advance()
        idx = self.intra[self.current_sample] if self.shuffle else self.current_sample
        self.current_sample += 1
        BT = self.B * self.T
        start = idx * self.world * BT + self.rank * BT
        run = self.shards[self.file()][start:start + BT + 1]
        return run[:BT], run[1:BT + 1]


def self_check():
    ok = True
    g = MT19937(5489)
    first = g.next()
    for _ in range(9998):
        g.next()
    tenthousandth = g.next()
    g137 = MT19937(137)
    five = [g137.next() for _ in range(5)]
    # The standard MT19937 (C++ [rand.predef]: the 10000th output of mt19937 is 4123659995) and the
    # outputs llm.c's rand.h documents for manual_seed(137) (PyTorch's torch.manual_seed(137)).
    for what, got, want in (("seed 5489, first", first, 3499211612),
                            ("seed 5489, 10000th", tenthousandth, 4123659995),
                            ("seed 137, first five", five, [4053805790, 2173880614, 380293709, 1237255315, 2986595568])):
        if got != want:
            print(f"MT19937 {what}: {got}, expected {want}")
            ok = False
    return ok


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    if sys.argv[1] == "--self-check":
        sys.exit(0 if self_check() else 1)
    if not self_check():
        sys.exit(1)
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    for n, c in enumerate(cases):
        shards = [read_shard(p) for p in c["shards"]]
        want = {}
        last = max(b["step"] for b in c["batches"])
        loader = Loader(shards, c["batch_size"], c["seq_len"], c["rank"], c["world_size"], c["seed"], c["shuffle"])
        for step in range(last + 1):
            want[step] = loader.next_batch()
        for b in c["batches"]:
            inputs, targets = want[b["step"]]
            for name, got, exp in (("inputs", b["inputs"], inputs), ("targets", b["targets"], targets)):
                if got != exp:
                    i = next(k for k in range(min(len(got), len(exp))) if got[k] != exp[k]) if len(got) == len(exp) else -1
                    print(f"case {n} (B={c['batch_size']} T={c['seq_len']} rank {c['rank']}/{c['world_size']} "
                          f"seed {c['seed']} shuffle {c['shuffle']}, {len(shards)} shards), batch {b['step']}: "
                          f"{name} differ at {i}: cutrain {got[i] if i >= 0 else len(got)}, "
                          f"reference {exp[i] if i >= 0 else len(exp)}")
                    sys.exit(1)
    print(f"llm.c order reference: {len(cases)} cases, "
          f"{sum(len(c['batches']) for c in cases)} batches agree")


if __name__ == "__main__":
    main()
