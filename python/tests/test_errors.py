# Bad input to the handles: each a Python exception that names what is wrong, with the C++
# engine's message where the engine finds it.
import os

import numpy as np
import pytest

import cutrain


@pytest.fixture
def h():
    h = cutrain.aio_handle(intra_op_parallelism=2)
    yield h
    h.close()


@pytest.fixture
def file_of_4096(tmp_path):
    p = str(tmp_path / "f.bin")
    with open(p, "wb") as f:
        f.write(bytes(range(256)) * 16)
    return p


def test_non_contiguous_tensor(h, file_of_4096):
    a = np.zeros((64, 64), dtype=np.uint8)
    for op in (h.sync_pread, h.async_pread, h.sync_pwrite, h.async_pwrite):
        with pytest.raises(ValueError, match=r"buffer is a non-contiguous tensor"):
            op(a[:, ::2], file_of_4096)
    with pytest.raises(ValueError, match="non-contiguous"):
        h.sync_pread(a.T, file_of_4096)
    assert h.wait() == 0  # nothing was queued


def test_tensor_larger_than_file(h, file_of_4096):
    with pytest.raises(cutrain.Error, match=r"cannot read 8192 bytes at offset 0 from '.*f.bin': the file holds 4096"):
        h.sync_pread(np.zeros(8192, dtype=np.uint8), file_of_4096)
    with pytest.raises(cutrain.Error, match="the file holds 4096"):
        h.sync_pread(np.zeros(100, dtype=np.uint8), file_of_4096, 4000)


def test_tensor_smaller_than_file_for_read(h, file_of_4096):
    with pytest.raises(ValueError, match=r"buffer holds 100 bytes but '.*f.bin' holds 4096.*smaller than the file"):
        h.read(np.zeros(100, dtype=np.uint8), file_of_4096, False)


def test_missing_file(h, tmp_path):
    missing = str(tmp_path / "missing.bin")
    with pytest.raises(cutrain.Error, match=r"cannot open '.*missing.bin' for reading: No such file or directory"):
        h.sync_pread(np.zeros(10, dtype=np.uint8), missing)
    with pytest.raises(cutrain.Error, match="missing.bin"):  # the engine opens the file at submission
        h.async_pread(np.zeros(10, dtype=np.uint8), missing)
    assert h.wait() == 0
    with pytest.raises(cutrain.Error, match="missing.bin"):
        h.read(np.zeros(10, dtype=np.uint8), missing, False)


def test_closed_handle(file_of_4096):
    h = cutrain.aio_handle()
    h.close()
    h.close()  # closing twice is fine
    buf = np.zeros(4096, dtype=np.uint8)
    for name, call in [("sync_pread", lambda: h.sync_pread(buf, file_of_4096)),
                       ("async_pwrite", lambda: h.async_pwrite(buf, file_of_4096)),
                       ("pread", lambda: h.pread(buf, file_of_4096, False, False)),
                       ("wait", lambda: h.wait()),
                       ("new_cpu_locked_tensor", lambda: h.new_cpu_locked_tensor(10, buf))]:
        with pytest.raises(ValueError, match=rf"{name}: the handle is closed"):
            call()


def test_not_a_tensor_and_read_only(h, file_of_4096):
    with pytest.raises(TypeError, match=r"sync_pread: buffer must be a tensor offering DLPack or the buffer protocol.*got str"):
        h.sync_pread("abc", file_of_4096)
    ro = np.frombuffer(bytes(4096), dtype=np.uint8)
    with pytest.raises(ValueError, match=r"sync_pread: buffer is read-only"):
        h.sync_pread(ro, file_of_4096)


def test_validate_needs_sync(h, file_of_4096):
    with pytest.raises(ValueError, match=r"pread: validate needs a synchronous call"):
        h.pread(np.zeros(4096, dtype=np.uint8), file_of_4096, True, True)


def test_validate_catches_a_different_file(h, file_of_4096, tmp_path):
    # pwrite with validate reads the file back: a write that landed is checked, byte for byte.
    p = str(tmp_path / "g.bin")
    src = np.arange(4096, dtype=np.uint16).view(np.uint8)[:4096].copy()
    assert h.pwrite(src, p, True, False) == 1
    with open(p, "rb") as f:
        assert f.read() == src.tobytes()


def test_bad_settings():
    with pytest.raises(cutrain.Error, match="block_size must be a positive multiple of 4096 bytes, got 1000"):
        cutrain.aio_handle(block_size=1000)
    with pytest.raises(cutrain.Error, match=r"intra_op_parallelism must be in \[1, 256\], got 0"):
        cutrain.aio_handle(intra_op_parallelism=0)


def test_gds_without_cufile_or_host_buffers(file_of_4096):
    ok, why = cutrain.gds_available()
    if not ok:
        with pytest.raises(cutrain.Error, match="GDS not available"):
            cutrain.gds_handle()
        assert why
        return
    g = cutrain.gds_handle()
    with pytest.raises(ValueError, match="gds_handle moves CUDA tensors"):
        g.sync_pread(np.zeros(4096, dtype=np.uint8), file_of_4096)
    g.close()


def test_buffer_protocol_objects_are_checked(h, file_of_4096):
    # Through the buffer protocol directly: the same checks and messages as through DLPack.
    with pytest.raises(TypeError, match=r"sync_pwrite: buffer must be a tensor .*got ndarray"):
        h.sync_pwrite(np.array([object()] * 8), file_of_4096)  # Python objects are not data
    with pytest.raises(ValueError, match=r"sync_pread: buffer is read-only \(memoryview\)"):
        h.sync_pread(memoryview(bytes(4096)), file_of_4096)
    with pytest.raises(ValueError, match=r"async_pwrite: buffer is a non-contiguous tensor \(memoryview\)"):
        h.async_pwrite(memoryview(bytearray(4096))[::2], file_of_4096)
    with pytest.raises(TypeError):
        h.sync_pread(np.zeros(16, dtype=np.uint8), 123)  # the file name must be a str
    assert h.wait() == 0
