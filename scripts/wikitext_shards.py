"""Token shards for the quality scripts (moe_quality.py, data_efficiency_quality.py, fp16_quality.py):
the text inputs (WikiText-2's valid + test, optionally cut to their first N bytes, or a --corpus of
text files, folders and .tar.xz / .tar.gz archives such as scripts/corpus-linux-doc.sh's) and
`cutrain prepare-data` over them with 10% of the documents held out for validation."""
import glob
import hashlib
import os
import shutil
import subprocess
import tarfile


def wikitext_inputs(data, work, text_bytes=0):
    """WikiText-2's valid.txt and test.txt under `data`; with text_bytes > 0, copies of their first
    text_bytes bytes in `work`."""
    inputs = [os.path.join(data, "wikitext-2", f) for f in ("valid.txt", "test.txt")]
    if text_bytes <= 0:
        return inputs
    cut = []
    for p in inputs:
        q = os.path.join(work, os.path.basename(p))
        with open(p, "rb") as src, open(q, "wb") as dst:
            dst.write(src.read(text_bytes))
        cut.append(q)
    return cut


def corpus_files(paths, work, die):
    """Every text file the --corpus paths name, as (name, path): archives extracted under work, in
    an order fixed by a hash of the names (so the first 10%, held out for validation, mixes topics)."""
    found = []
    for p in paths:
        if os.path.isdir(p):
            for d, _, files in os.walk(p):
                for f in files:
                    full = os.path.join(d, f)
                    found.append((os.path.relpath(full, p), full))
        elif p.endswith((".tar.xz", ".txz", ".tar.gz", ".tgz", ".tar")):
            dest = os.path.join(work, "corpus_" + hashlib.sha1(p.encode()).hexdigest()[:8])
            shutil.rmtree(dest, ignore_errors=True)
            with tarfile.open(p) as t:
                members = [m for m in t.getmembers() if m.isfile() and not os.path.isabs(m.name) and ".." not in m.name]
                try:
                    t.extractall(dest, members=members, filter="data")
                except TypeError:  # a Python before 3.11.4: no extraction filters
                    t.extractall(dest, members=members)
            found += [(os.path.normpath(m.name), os.path.join(dest, m.name)) for m in members]
        else:
            found.append((os.path.basename(p), p))
    if not found:
        die(f"--corpus: expected text files, found none under {' '.join(paths)}")
    found.sort(key=lambda x: hashlib.sha1(x[0].encode()).hexdigest())
    return found


def corpus_inputs(paths, work, text_bytes, die):
    """The --corpus files as prepare-data's inputs: eight parts of whole files in corpus_files'
    order (each file's documents split on blank lines by prepare-data), the first text_bytes bytes
    when > 0. Returns (inputs, a description naming the corpus and its file count)."""
    for f in glob.glob(os.path.join(work, "part_*.txt")):
        os.remove(f)
    files = corpus_files(paths, work, die)
    parts = [os.path.join(work, f"part_{i}.txt") for i in range(min(8, len(files)))]
    outs = [open(p, "wb") for p in parts]
    total = 0
    for i, (_, path) in enumerate(files):
        with open(path, "rb") as f:
            text = f.read()
        if text_bytes > 0:
            text = text[:max(0, text_bytes - total)]
        if not text:
            continue
        total += len(text)
        dst = outs[i * len(outs) // len(files)]
        dst.write(text.rstrip(b"\n") + b"\n\n")
    for f in outs:
        f.close()
    return parts, f"--corpus {' '.join(os.path.basename(p.rstrip('/')) for p in paths)} ({len(files)} files)"


def shard_tokens(stdout):
    """prepare-data's token counts ("N val + M train tokens") from its stdout, or "?"."""
    line = next((l for l in stdout.splitlines() if "val +" in l and "train tokens" in l), "")
    return line.split("), ", 1)[1].split(" (vocab")[0] if "), " in line else "?"


def prepare_shards(cutrain, inputs, data, prefix, die):
    """`cutrain prepare-data` with the GPT-2 tokenizer files under `data`: PREFIX_train_*.bin and
    PREFIX_val_*.bin; its stdout on success, `die(message)` on failure."""
    cmd = [cutrain, "prepare-data", "--input", *inputs, "--vocab", os.path.join(data, "gpt2", "encoder.json"),
           "--merges", os.path.join(data, "gpt2", "vocab.bpe"), "--output", prefix, "--val_fraction", "0.1"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        die("prepare-data failed:\n" + p.stdout[-2000:] + p.stderr[-2000:])
    return p.stdout
