"""cutrain from Python: DeepNVMe's I/O handles over cutrain's engine, training, checkpoints.

A DeepNVMe script runs on cutrain by changing its import:

    from cutrain import AsyncIOBuilder            # was: from deepspeed.ops.op_builder import AsyncIOBuilder
    h = AsyncIOBuilder().load().aio_handle(1024**2, 128, False, False, 4)
    h.sync_pwrite(tensor, "/mnt/nvme/t.pt")

docs/python.md has the tutorial's examples.
"""
import importlib.util
import json
import os
import tempfile

# PyTorch first where it is installed: the module and torch both load libnccl.so.2 and the CUDA
# runtime by soname, and the process keeps whichever loads first; torch's own (as new as torch
# needs) serve cutrain as well, while a system NCCL loaded first can lack symbols torch needs.
if importlib.util.find_spec("torch") is not None:
    try:
        import torch  # noqa: F401
    except ImportError:
        pass

from ._cutrain import Error, Trainer, __version__, aio_handle, gds_available, gds_handle
from . import _cutrain

Error.__module__ = "cutrain"

__all__ = ["Error", "__version__", "aio_handle", "gds_handle", "gds_available", "AsyncIOBuilder", "GDSBuilder",
           "train", "load_checkpoint", "train_flags", "Trainer"]


class _Op:
    """What ``AsyncIOBuilder().load()`` returns in DeepSpeed: the op module with its handle class."""

    def __init__(self, handle):
        self._handle = handle

    def __getattr__(self, name):
        if name in ("aio_handle", "gds_handle"):
            return self._handle
        raise AttributeError(name)


class AsyncIOBuilder:
    """DeepSpeed's op builder for async_io: ``AsyncIOBuilder().load().aio_handle(...)``."""

    def is_compatible(self, verbose=False):
        return True

    def load(self, verbose=True):
        return _Op(aio_handle)


class GDSBuilder:
    """DeepSpeed's op builder for GDS: ``GDSBuilder().load().gds_handle(...)``."""

    def is_compatible(self, verbose=False):
        return gds_available()[0]

    def load(self, verbose=True):
        return _Op(gds_handle)


def train_flags():
    """The keyword flags train() takes (``cutrain train``'s flags of the same names)."""
    return list(_cutrain._train_flags())


def train(config=None, quiet=False, **flags):
    """Runs ``cutrain train`` and returns its metrics.

    config: a DeepSpeed JSON file, or a dict of one. flags: ``cutrain train``'s flags by name
    (``num_steps=10, device="cpu", save="ckpt/"``; train_flags() lists them). quiet: no output.
    Returns a dict: losses (one per step), final_loss, avg_step_time (s), peak_bytes,
    alloc_bytes, params, evals (validation points), checkpoints (saves, bytes, times).
    """
    if config is None:
        raise TypeError("train: config= is required (a DeepSpeed JSON file, or a dict of one)")
    if isinstance(config, dict):
        with tempfile.TemporaryDirectory(prefix="cutrain-config-") as d:
            path = os.path.join(d, "config.json")
            with open(path, "w") as f:
                json.dump(config, f)
            return _cutrain._train(path, flags, quiet)
    return _cutrain._train(os.fspath(config), flags, quiet)


def load_checkpoint(path, framework=None):
    """The model tensors of a checkpoint (a ``--save`` root or one of its step folders), verified
    against its manifest, as {state_dict name: tensor}.

    framework: "torch" (torch tensors in the file's dtypes, for ``load_state_dict``) or "numpy"
    (bf16 widened exactly to float32); default torch when it imports, else numpy.
    """
    if framework is None:
        try:
            import torch  # noqa: F401
            framework = "torch"
        except ImportError:
            framework = "numpy"
    return _cutrain._load_checkpoint(os.fspath(path), framework)
