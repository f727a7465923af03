# cutrain.Trainer on the CPU reference backend: steps on the caller's batches, evaluation, the
# checks on its inputs. (Offload of the GPU engine's states: test_torch.py, with a device.)
import os

import numpy as np
import pytest

import cutrain

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPE = dict(hidden_dim=64, num_layers=2, num_heads=4, vocab_size=512, batch_size=2, seq_length=32)


def trainer(config="baseline", **kw):
    return cutrain.Trainer(os.path.join(ROOT, "configs", f"{config}.json"), device="cpu", **SHAPE, **kw)


def batch(rng, lead=1):
    shape = (lead, SHAPE["batch_size"], SHAPE["seq_length"])
    return rng.integers(0, SHAPE["vocab_size"], size=shape, dtype=np.int32), \
        rng.integers(0, SHAPE["vocab_size"], size=shape, dtype=np.int32)


def test_loss_falls_on_a_fixed_batch_and_runs_repeat(rng):
    x, y = batch(rng)
    a, b = trainer(), trainer()
    la = [a.step(x, y)["loss"] for _ in range(6)]
    lb = [b.step(x, y)["loss"] for _ in range(6)]
    assert la == lb  # same seed, same batches: the same numbers
    assert all(l1 < l0 for l0, l1 in zip(la, la[1:]))
    assert a.steps == 6
    # The evaluation's loss is the next step's loss (same parameters, same batch), no update made.
    e = a.eval_loss(x[0], y[0])
    assert e == pytest.approx(a.step(x, y)["loss"], rel=1e-12)


def test_step_reports_the_schedule_lr(rng):
    x, y = batch(rng)
    t = trainer()
    s = t.step(x, y)
    assert s["step"] == 1 and np.isfinite(s["grad_norm"]) and s["skipped"] is False
    assert t.step(x, y, lr=0.0)["lr"] == 0.0
    # lr 0 changes nothing: the same loss again.
    assert t.step(x, y, lr=0.0)["loss"] == pytest.approx(t.eval_loss(x[0], y[0]), rel=1e-12)


def test_bad_batches(rng):
    t = trainer()
    x, y = batch(rng)
    with pytest.raises(TypeError, match="tokens must be a host int32 tensor"):
        t.step(x.astype(np.int64), y)
    with pytest.raises(ValueError, match="labels holds 32 ids, expected 64"):
        t.step(x, y[:, :1])
    bad = x.copy()
    bad[0, 1, 5] = 512
    with pytest.raises(ValueError, match=r"tokens\[37\] is 512, outside \[0, 512\)"):
        t.step(bad, y)
    with pytest.raises(ValueError, match="non-contiguous"):
        t.eval_loss(np.ascontiguousarray(np.concatenate([x[0], x[0]], axis=1))[:, ::2], y[0])
    assert t.steps == 0


def test_offload_needs_the_gpu_engine():
    t = trainer()
    with pytest.raises(cutrain.Error, match="offload_states: the training state is offloaded by the GPU engine"):
        t.offload_states()
    with pytest.raises(cutrain.Error, match="reload_states"):
        t.reload_states()


def test_bad_settings():
    with pytest.raises(cutrain.Error, match="device"):
        cutrain.Trainer(os.path.join(ROOT, "configs", "baseline.json"), device="tpu", **SHAPE)
    with pytest.raises(cutrain.Error, match="heads"):
        cutrain.Trainer(os.path.join(ROOT, "configs", "baseline.json"), device="cpu",
                        **dict(SHAPE, num_heads=5))
    with pytest.raises(cutrain.Error, match="missing.json"):
        cutrain.Trainer(os.path.join(ROOT, "configs", "missing.json"), device="cpu", **SHAPE)
