"""Token shards for the quality scripts (moe_quality.py, data_efficiency_quality.py): the text
inputs (WikiText-2's valid + test, optionally cut to their first N bytes) and `cutrain
prepare-data` over them with 10% of the documents held out for validation."""
import os
import subprocess


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


def prepare_shards(cutrain, inputs, data, prefix, die):
    """`cutrain prepare-data` with the GPT-2 tokenizer files under `data`: PREFIX_train_*.bin and
    PREFIX_val_*.bin; its stdout on success, `die(message)` on failure."""
    cmd = [cutrain, "prepare-data", "--input", *inputs, "--vocab", os.path.join(data, "gpt2", "encoder.json"),
           "--merges", os.path.join(data, "gpt2", "vocab.bpe"), "--output", prefix, "--val_fraction", "0.1"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        die("prepare-data failed:\n" + p.stdout[-2000:] + p.stderr[-2000:])
    return p.stdout
