# train() and load_checkpoint(): the CPU reference backend, a few steps, the checkpoint's model
# tensors read back against the file's own header and bytes.
import json
import os
import struct

import numpy as np
import pytest

import cutrain

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = dict(device="cpu", hidden_dim=64, num_layers=2, num_heads=4, vocab_size=512, batch_size=2, seq_length=32,
             warmup_steps=1, quiet=True)


def safetensors_tensors(path):
    """name -> float64 array, straight from the file's header and bytes (bf16 decoded here)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[b:e]
        if info["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, dtype={"F32": np.float32, "F16": np.float16}[info["dtype"]])
        out[name] = (info["dtype"], a.reshape(info["shape"]).astype(np.float64))
    return out


@pytest.mark.parametrize("config", ["baseline", "bf16_full"])
def test_train_then_load_checkpoint(tmp_path, config):
    save = str(tmp_path / "ck")
    m = cutrain.train(config=os.path.join(ROOT, "configs", f"{config}.json"), num_steps=3, save=save, **SMALL)
    assert len(m["losses"]) == 3 and all(np.isfinite(m["losses"]))
    assert m["final_loss"] == m["losses"][-1]
    assert m["params"] > 0 and m["checkpoints"]["saves"] == 1 and m["checkpoints"]["failed_steps"] == []
    sd = cutrain.load_checkpoint(save, framework="numpy")
    step = os.path.join(save, "global_step3")
    want = safetensors_tensors(os.path.join(step, "model.safetensors"))
    assert set(sd) == set(want)
    assert "embedding.weight" in sd and "layers.0.attention.in_proj_weight" in sd
    assert sum(v.size for v in sd.values()) == m["params"]
    for name, (dtype, a) in want.items():
        assert sd[name].shape == a.shape
        assert sd[name].dtype == np.float32 or dtype == "F16"
        np.testing.assert_array_equal(sd[name].astype(np.float64), a)
    # A step folder works as well as the root.
    sd2 = cutrain.load_checkpoint(step, framework="numpy")
    np.testing.assert_array_equal(sd2["embedding.weight"], sd["embedding.weight"])


def test_train_config_as_dict_and_same_losses(tmp_path):
    path = os.path.join(ROOT, "configs", "baseline.json")
    with open(path) as f:
        cfg = json.load(f)
    a = cutrain.train(config=path, num_steps=2, **SMALL)
    b = cutrain.train(config=cfg, num_steps=2, **SMALL)
    assert a["losses"] == b["losses"]  # same seed, same data: bit-identical


def test_train_bad_input(tmp_path):
    cfg = os.path.join(ROOT, "configs", "baseline.json")
    with pytest.raises(TypeError, match="config= is required"):
        cutrain.train(num_steps=1)
    with pytest.raises(TypeError, match=r"train: unknown flag 'num_step' \(expected one of: .*num_steps"):
        cutrain.train(config=cfg, num_step=1)
    with pytest.raises(TypeError, match="train: num_steps must be an int, got str"):
        cutrain.train(config=cfg, num_steps="3")
    with pytest.raises(cutrain.Error, match="device"):
        cutrain.train(config=cfg, device="tpu")
    with pytest.raises(cutrain.Error, match="missing.json"):
        cutrain.train(config=str(tmp_path / "missing.json"), **SMALL)
    with pytest.raises(cutrain.Error, match='data_order: expected one of "shuffled", "llmc", found "nanogpt"'):
        cutrain.train(config=cfg, data_order="nanogpt", **SMALL)
    with pytest.raises(cutrain.Error, match="data order orders the token shards' batches: expected --use_real_data"):
        cutrain.train(config=cfg, data_order="llmc", **SMALL)
    assert "num_steps" in cutrain.train_flags()
    assert "data_order" in cutrain.train_flags()
    with pytest.raises(cutrain.Error, match='attention_backward: expected one of "deterministic", "fast", found "quick"'):
        cutrain.train(config=cfg, attention_backward="quick", **SMALL)
    assert "attention_backward" in cutrain.train_flags()


def test_train_bert():
    """model="bert": the model from bert_config, the micro-batch from the DeepSpeed config (4), seeded losses."""
    bert = dict(model="bert", bert_config=os.path.join(ROOT, "configs", "bert_tiny.json"), device="cpu",
                max_seq_length=16, num_steps=2, warmup_steps=1, quiet=True)
    cfg = os.path.join(ROOT, "configs", "bert_tiny_lamb.json")
    a = cutrain.train(config=cfg, **bert)
    b = cutrain.train(config=cfg, **bert)
    assert a["losses"] == b["losses"] and all(np.isfinite(a["losses"]))
    assert 9.0 < a["losses"][0] < 12.0  # about ln(50259): the masked-LM head over GPT-2's tokens + 2
    with open(cfg) as f:
        micro2 = {**json.load(f), "train_micro_batch_size_per_gpu": 2}
    with pytest.raises(cutrain.Error, match="batch_size: expected the run's micro-batch 2 .*found 4"):
        cutrain.train(config=micro2, **bert)  # bert_tiny.json's DeepSpeedTransformerConfig batch_size is 4


def test_load_checkpoint_bad_input(tmp_path):
    with pytest.raises(cutrain.Error, match="nothing"):
        cutrain.load_checkpoint(str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="framework must be 'torch' or 'numpy'"):
        cutrain.load_checkpoint(str(tmp_path), framework="jax")
