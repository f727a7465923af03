# Shared by the Python tests: a folder on a real file system (O_DIRECT needs one; /dev/shm is
# tmpfs, which refuses it and makes the engine fall back to buffered I/O) and the handle settings.
import os

import numpy as np
import pytest

import cutrain


@pytest.fixture
def folder(tmp_path):
    return str(tmp_path)


@pytest.fixture
def rng():
    return np.random.default_rng(int.from_bytes(os.urandom(4), "little"))


@pytest.fixture(params=[1, 4], ids=["par1", "par4"])
def handle(request):
    h = cutrain.aio_handle(block_size=64 * 1024, queue_depth=8, single_submit=False, overlap_events=False,
                           intra_op_parallelism=request.param)
    yield h
    h.close()
