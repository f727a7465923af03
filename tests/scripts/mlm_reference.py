#!/usr/bin/env python3
"""Reference of BERT's masked-LM batches (data/mlm_sampler.h, data/mlm_masking.h) in plain Python:
reads llm.c token shards itself, cuts every document (tokens between EOT tokens) into pieces of at
most S tokens, orders an epoch's pieces by a Fisher-Yates shuffle from a SplitMix64 stream keyed by
(seed, epoch), or draws synthetic samples (length uniform in [max(1, S/2), S], random real tokens),
and masks sample number k with the rule: n = min(max_predictions, max(1, round-half-up(0.15 len)))
positions by a partial Fisher-Yates, each -> [MASK] (8 in 10), a random real token (1 in 10) or
unchanged (1 in 10); labels = the original token there, -100 elsewhere and on [PAD].

  mlm_reference.py CPP_DUMP.json
The dump (written by test_mlm_sampler) lists cases, each with its options and a few micro-batches as
cutrain filled them. Exit 0 when every batch is equal token for token and the rule's statistics
hold on the reference's own draws (15% chosen, 80/10/10, labels only at chosen positions, none on
padding); 1 with the first difference otherwise.
"""
import json
import sys

from llmc_shard import read_shard

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
IGNORE = -100
STREAM_MASK, STREAM_SYNTHETIC, STREAM_EPOCH = 1, 2, 3


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def key(seed, stream, number):
    return mix(mix((seed + GOLDEN * (stream + 1)) & MASK64) ^ ((number + GOLDEN) & MASK64))


class Rng:
    def __init__(self, k):
        self.state = k

    def next(self):
        self.state = (self.state + GOLDEN) & MASK64
        return mix(self.state)

    def below(self, n):
        return (self.next() * n) >> 64


def pieces(tokens, seq_len, eot):
    out, begin = [], 0
    for i in range(len(tokens) + 1):
        if i < len(tokens) and tokens[i] != eot:
            continue
        for s in range(begin, i, seq_len):
            out.append(tokens[s:min(i, s + seq_len)])
        begin = i + 1
    return out


def num_predictions(length, max_predictions):
    return min(max_predictions, max(1, (15 * length + 50) // 100))


def mask(sample, k, c, row_len):
    """The masked tokens and labels of sample number k (a list of real tokens), padded to row_len."""
    tokens = list(sample) + [c["pad_id"]] * (row_len - len(sample))
    labels = [IGNORE] * row_len
    n = num_predictions(len(sample), c["max_predictions"])
    order = list(range(len(sample)))
    rng = Rng(key(c["seed"], STREAM_MASK, k))
    for i in range(n):
        j = i + rng.below(len(sample) - i)
        order[i], order[j] = order[j], order[i]
    for p in order[:n]:
        labels[p] = tokens[p]
        r = rng.below(10)
        if r < 8:
            tokens[p] = c["mask_id"]
        elif r == 8:
            tokens[p] = rng.below(c["random_tokens"])
    return tokens, labels


class Sampler:
    def __init__(self, c):
        self.c = c
        self.pieces = []
        for path in c["shards"]:
            self.pieces += pieces(read_shard(path), c["seq_len"], c["eot"])
        self.epoch, self.order = -1, []

    def raw(self, k):
        c = self.c
        if c["synthetic"]:
            rng = Rng(key(c["seed"], STREAM_SYNTHETIC, k))
            lo = max(1, c["seq_len"] // 2)
            length = lo + rng.below(c["seq_len"] - lo + 1)
            return [rng.below(c["random_tokens"]) for _ in range(length)]
        n = len(self.pieces)
        if k // n != self.epoch:
            self.epoch = k // n
            self.order = list(range(n))
            if c["shuffle"]:
                rng = Rng(key(c["seed"], STREAM_EPOCH, self.epoch))
                for i in range(n, 1, -1):
                    j = rng.below(i)
                    self.order[i - 1], self.order[j] = self.order[j], self.order[i - 1]
        return self.pieces[self.order[k % n]]

    def batch(self, m):
        c = self.c
        b_size = c["batch_size"]
        samples = [self.raw(m * b_size + b) for b in range(b_size)]
        row_len = max(len(s) for s in samples) if c["pad_to_longest"] else c["seq_len"]
        tokens, labels = [], []
        for b, s in enumerate(samples):
            t, l = mask(s, m * b_size + b, c, row_len)
            tokens += t
            labels += l
        return row_len, tokens, labels


def check_statistics(c):
    """The rule on many draws of this case's samples: counts, 80/10/10, labels where they belong."""
    s = Sampler(c)
    chosen = masked = kept = replaced = real = 0
    for m in range(400):
        row_len, tokens, labels = s.batch(m)
        for b in range(c["batch_size"]):
            sample = s.raw(m * c["batch_size"] + b)
            real += len(sample)
            n = 0
            for t in range(row_len):
                tok, lab = tokens[b * row_len + t], labels[b * row_len + t]
                if t >= len(sample):
                    if tok != c["pad_id"] or lab != IGNORE:
                        return f"padding at row {b} position {t} holds token {tok} label {lab}"
                    continue
                if lab == IGNORE:
                    if tok != sample[t]:
                        return f"an unchosen token changed at row {b} position {t}"
                    continue
                n += 1
                if lab != sample[t]:
                    return f"label {lab} is not the original token {sample[t]}"
                if tok == c["mask_id"]:
                    masked += 1
                elif tok == lab:
                    kept += 1
                else:
                    replaced += 1
            if n != num_predictions(len(sample), c["max_predictions"]):
                return f"{n} labels in a sample of {len(sample)} tokens"
            chosen += n
    # A random replacement equal to the original counts as kept: negligible at this vocabulary.
    for what, got, want in (("masked", masked, 0.8), ("random", replaced, 0.1), ("kept", kept, 0.1)):
        if abs(got / chosen - want) > 0.03:
            return f"{what}: {got / chosen:.4f} of the chosen positions, expected {want} +- 0.03"
    if c["max_predictions"] >= c["seq_len"]:  # no cap: 15% of the real tokens (rounded per sample)
        if abs(chosen / real - 0.15) > 0.03:
            return f"{chosen / real:.4f} of the real tokens chosen, expected 0.15 +- 0.03"
    return None


def main():
    cases = json.load(open(sys.argv[1]))
    for i, c in enumerate(cases):
        s = Sampler(c)
        for want in c["batches"]:
            row_len, tokens, labels = s.batch(want["micro_batch"])
            where = f"case {i} ({'synthetic' if c['synthetic'] else 'shards'}), micro-batch {want['micro_batch']}"
            if row_len != want["row_len"]:
                print(f"{where}: row length {want['row_len']} in cutrain, {row_len} in the reference")
                return 1
            for name, got, ref in (("tokens", want["tokens"], tokens), ("labels", want["labels"], labels)):
                if got != ref:
                    j = next(j for j in range(len(ref)) if got[j] != ref[j])
                    print(f"{where}: {name}[{j}] is {got[j]} in cutrain, {ref[j]} in the reference")
                    return 1
        problem = check_statistics(c)
        if problem:
            print(f"case {i}: {problem}")
            return 1
    print(f"ok: {len(cases)} cases equal to cutrain's batches; the rule's statistics hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
