#!/usr/bin/env python3
"""Writes tests/data/gpt2_tokenizer_golden.json: GPT-2 token ids of tricky strings, of seeded random
Unicode strings, and of the WikiText-2 splits (count, FNV-1a hash, first ids), for
tests/unit/test_tokenizer.cpp. Needs `pip install tokenizers regex` (not needed by the tests).

Two independent encoders must agree before anything is written: Hugging Face `tokenizers` (Rust)
built from the same encoder.json / vocab.bpe, and a direct implementation of GPT-2's encoder on top
of the `regex` package (the pattern GPT-2 ships, bytes_to_unicode, rank-ordered merges).

Usage: python3 scripts/gen_tokenizer_golden.py [DATA_DIR=../shared/data] > tests/data/gpt2_tokenizer_golden.json
"""
import json
import random
import sys
import unicodedata

import regex
from tokenizers import ByteLevelBPETokenizer

DATA = sys.argv[1] if len(sys.argv) > 1 else "../shared/data"
VOCAB, MERGES = f"{DATA}/gpt2/encoder.json", f"{DATA}/gpt2/vocab.bpe"
PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def byte_map():
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


class RegexGpt2:
    def __init__(self):
        self.enc = json.load(open(VOCAB, encoding="utf-8"))
        lines = open(MERGES, encoding="utf-8").read().split("\n")[1:]
        self.ranks = {tuple(l.split()): i for i, l in enumerate(l for l in lines if l.strip())}
        self.bmap = byte_map()
        self.cache = {}

    def bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        parts = list(word)
        while len(parts) > 1:
            pairs = {(parts[i], parts[i + 1]) for i in range(len(parts) - 1)}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        self.cache[word] = parts
        return parts

    def encode(self, text):
        ids = []
        for piece in PATTERN.findall(text):
            word = "".join(self.bmap[b] for b in piece.encode("utf-8"))
            ids.extend(self.enc[t] for t in self.bpe(word))
        return ids


TRICKY = [
    "Hello world", "Hello, world!", " Hello world", "hello  world", "don't", "Don't you'll we've I'm he'd they're",
    "DON'T", "'s's'''s", "it's 'quoted' ''", "rock'n'roll", "2024-12-02 12:34:56.789", "3.14159 1,000,000 007",
    "x²+y³=z¼ ½ Ⅻ ①", "naïve café Ünïcödé", "Привет мир", "中文字符测试", "日本語のテキスト", "한국어 텍스트",
    "مرحبا بالعالم", "שלום עולם", "🙂🙃 👩‍👩‍👧‍👦 🇩🇪 ❤️", "tab\there", "a\n\nb", "line\r\nbreak", "   leading",
    "trailing   ", "mixed \t \n  spaces \u00a0nbsp\u2003em\u3000ideo", "\u2028\u2029\u0085", "\x1c\x1d\x1e\x1f sep",
    "\x00\x01\x07 control", "emoji🙂inside", "$100.00 (50%) #tag @user", "<|endoftext|>", "a" * 300,
    " " * 50 + "x", "9" * 120, "....!!!???", "\n", " ", "", "Mr. O'Neil's dog", "e.g. i.e. etc.",
    "\ufeffBOM", "combining e\u0301 a\u0308", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚", "ǅungla ǈ", "ʰʲ ˀ", "゛゜ー",
]


def random_char(rng):
    # Only characters assigned in this Python's Unicode version: the C++ tables come from the same
    # unicodedata, while `regex` may know a newer Unicode (a char unassigned here may be a letter there).
    while True:
        c = chr(rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FFF), rng.randint(0x3000, 0xD7FF),
                            rng.randint(0xE000, 0xFFFD), rng.randint(0x10000, 0x1FAFF)]))
        if unicodedata.category(c) != "Cn":
            return c


def random_strings(n, seed=20261202):
    rng = random.Random(seed)
    pools = [" ", "  ", "\n", "\t", "'", "'s", "'ll", "a", "Z", "é", "ß", "1", "٣", "Ⅷ", "?", "!", ".", "-", "😀",
             "中", "\u00a0", "\u2009", "\u3000", "\x1e", "ـ", "\u0301"]
    out = []
    for _ in range(n):
        k = rng.randint(1, 24)
        s = "".join(rng.choice(pools) if rng.random() < 0.7 else random_char(rng) for _ in range(k))
        out.append(s)
    return out


def fnv1a(ids):
    h = 0xCBF29CE484222325
    for t in ids:
        for b in int(t).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    hf = ByteLevelBPETokenizer(VOCAB, MERGES)  # add_prefix_space=False: GPT-2's settings
    ref = RegexGpt2()

    def ids(s):
        a = ref.encode(s)
        b = hf.encode(s).ids if s else []
        if a != b:
            raise SystemExit(f"encoders disagree on {s!r}:\n regex {a}\n hf    {b}")
        return a

    cases = [{"text": s, "ids": ids(s)} for s in TRICKY + random_strings(300)]
    wiki = {}
    for split in ("valid", "test"):
        text = open(f"{DATA}/wikitext-2/{split}.txt", encoding="utf-8").read()
        t = ids(text)
        wiki[split] = {"bytes": len(text.encode("utf-8")), "count": len(t), "fnv1a64": fnv1a(t), "first": t[:256]}
    json.dump({"generator": "scripts/gen_tokenizer_golden.py", "tokenizers": __import__("tokenizers").__version__,
               "regex": regex.__version__, "cases": cases, "wikitext2": wiki}, sys.stdout, ensure_ascii=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
