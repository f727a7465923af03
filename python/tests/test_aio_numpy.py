# aio_handle on NumPy arrays: DeepNVMe's methods, their return values, and the bytes on disk.
import os

import numpy as np
import pytest

import cutrain

# Odd sizes: an O_DIRECT body with a buffered tail, a size under one block, several blocks.
SIZES = [1, 4095, 4096, 64 * 1024 + 13, 3 * 1024 * 1024 + 512]


def random_bytes(rng, n):
    return rng.integers(0, 256, size=n, dtype=np.uint8)


def test_getters_are_the_constructor_arguments():
    h = cutrain.aio_handle(2 * 1024 * 1024, 32, True, True, 3)
    assert h.get_block_size() == 2 * 1024 * 1024
    assert h.get_queue_depth() == 32
    assert h.get_single_submit() is True
    assert h.get_overlap_events() is True
    assert h.get_intra_op_parallelism() == 3
    assert h.get_alignment() == 3 * 4096
    h.close()


def test_defaults_are_deepspeeds():
    h = cutrain.aio_handle()
    assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(), h.get_overlap_events(),
            h.get_intra_op_parallelism()) == (1024 * 1024, 128, False, False, 1)
    h.close()


@pytest.mark.parametrize("n", SIZES)
def test_sync_write_then_read(handle, folder, rng, n):
    path = os.path.join(folder, "t.bin")
    src = random_bytes(rng, n)
    assert handle.sync_pwrite(src, path) == 1
    with open(path, "rb") as f:
        assert f.read() == src.tobytes()
    dst = np.full(n, 0xAB, dtype=np.uint8)  # poisoned
    assert handle.sync_pread(dst, path) == 1
    np.testing.assert_array_equal(dst, src)


@pytest.mark.parametrize("n", SIZES)
def test_async_write_then_read(handle, folder, rng, n):
    paths = [os.path.join(folder, f"t{i}.bin") for i in range(3)]
    srcs = [random_bytes(rng, n) for _ in paths]
    for s, p in zip(srcs, paths):
        assert handle.async_pwrite(s, p) == 0
    assert handle.wait() == len(paths)
    dsts = [np.zeros(n, dtype=np.uint8) for _ in paths]
    for d, p in zip(dsts, paths):
        assert handle.async_pread(d, p) == 0
    assert handle.wait() == len(paths)
    for s, d in zip(srcs, dsts):
        np.testing.assert_array_equal(d, s)
    assert handle.wait() == 0


def test_pread_pwrite_flags(handle, folder, rng):
    path = os.path.join(folder, "t.bin")
    src = rng.standard_normal(100_003).astype(np.float32)
    assert handle.pwrite(src, path, True, False) == 1   # validate, sync
    assert handle.pwrite(src, path, False, True) == 0   # async
    assert handle.wait() == 1
    dst = np.zeros_like(src)
    assert handle.pread(dst, path, True, False) == 1
    np.testing.assert_array_equal(dst, src)
    dst[:] = 0
    assert handle.pread(dst, path, False, True) == 0
    assert handle.wait() == 1
    np.testing.assert_array_equal(dst, src)


def test_file_offset(handle, folder, rng):
    path = os.path.join(folder, "t.bin")
    a, b = random_bytes(rng, 8192), random_bytes(rng, 5000)
    handle.sync_pwrite(a, path)
    handle.sync_pwrite(b, path, 8192)
    got = np.zeros(5000, dtype=np.uint8)
    handle.sync_pread(got, path, file_offset=8192)
    np.testing.assert_array_equal(got, b)
    assert os.path.getsize(path) == 8192 + 5000


def test_read_write_whole_file(handle, folder, rng):
    path = os.path.join(folder, "t.bin")
    src = rng.integers(-2**31, 2**31 - 1, size=12345, dtype=np.int32)
    assert handle.write(src, path, True) == 0
    dst = np.zeros_like(src)
    assert handle.read(dst, path, True) == 0
    np.testing.assert_array_equal(dst, src)


def test_multidimensional_and_other_buffers(handle, folder, rng):
    path = os.path.join(folder, "t.bin")
    src = rng.standard_normal((37, 5, 11))  # float64, 3-D
    handle.sync_pwrite(src, path)
    dst = bytearray(src.nbytes)  # the buffer protocol without NumPy
    handle.sync_pread(dst, path)
    assert bytes(dst) == src.tobytes()
    handle.sync_pwrite(memoryview(bytes(dst)), path)  # a read-only buffer is fine for a write


def test_locked_tensor(handle, folder, rng):
    example = np.zeros(1, dtype=np.float32)
    t = handle.new_cpu_locked_tensor(300_001, example)
    assert isinstance(t, np.ndarray) and t.dtype == np.float32 and t.shape == (300_001,)
    assert t.ctypes.data % 4096 == 0
    assert handle.is_pinned(t) and not handle.is_pinned(example)
    t[:] = rng.standard_normal(t.shape[0]).astype(np.float32)
    path = os.path.join(folder, "t.bin")
    handle.sync_pwrite(t, path)
    back = handle.new_cpu_locked_tensor(300_001, example)
    handle.sync_pread(back, path)
    np.testing.assert_array_equal(back, t)
    assert handle.free_cpu_locked_tensor(t) is True
    assert handle.free_cpu_locked_tensor(t) is False          # already released
    assert handle.free_cpu_locked_tensor(example) is False    # never ours
    assert handle.free_cpu_locked_tensor(back) is True


def test_builders_as_deepspeed_spells_them(folder, rng):
    h = cutrain.AsyncIOBuilder().load().aio_handle(1024 * 1024, 16, False, False, 2)
    src = random_bytes(rng, 10_000)
    path = os.path.join(folder, "t.bin")
    h.sync_pwrite(src, path)
    dst = np.zeros_like(src)
    h.sync_pread(dst, path)
    np.testing.assert_array_equal(dst, src)
    assert cutrain.GDSBuilder().is_compatible() == cutrain.gds_available()[0]


def test_context_manager_closes(folder):
    with cutrain.aio_handle() as h:
        h.sync_pwrite(np.arange(10, dtype=np.uint8), os.path.join(folder, "t.bin"))
    with pytest.raises(ValueError, match="closed"):
        h.sync_pread(np.zeros(10, dtype=np.uint8), os.path.join(folder, "t.bin"))


def test_queued_tensor_outlives_the_callers_reference(handle, folder, rng):
    # The handle keeps what an async call was given until wait(): a temporary array, and a
    # bytearray whose export it holds (it cannot be resized under the I/O).
    path = os.path.join(folder, "t.bin")
    src = random_bytes(rng, 3 * 4096 + 5)
    assert handle.async_pwrite(src.copy(), path) == 0
    ba = bytearray(len(src))
    handle.wait()
    assert handle.async_pread(ba, path) == 0
    with pytest.raises(BufferError):
        ba.extend(b"x")
    assert handle.wait() == 1
    assert bytes(ba) == src.tobytes()
    ba.extend(b"x")  # released at wait()
    back = bytearray(len(src))
    assert handle.sync_pread(back, path) == 1
    assert bytes(back) == src.tobytes()


def test_small_and_empty_requests(handle, folder, rng):
    # Requests of a block or less run on the calling thread in the engine: the same results.
    path = os.path.join(folder, "t.bin")
    for n in (1, 100, 4096, 4096 + 3, 65536):
        for off in (0, 4096, 7):
            src = random_bytes(rng, n)
            assert handle.sync_pwrite(src, path, off) == 1
            dst = np.full(n, 0xCD, dtype=np.uint8)
            assert handle.sync_pread(dst, path, off) == 1
            np.testing.assert_array_equal(dst, src)
    empty = np.zeros(0, dtype=np.uint8)
    assert handle.sync_pread(empty, path) == 1 and handle.sync_pwrite(empty, path) == 1
