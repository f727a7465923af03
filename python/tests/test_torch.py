# PyTorch tensors (CPU and CUDA) and CuPy arrays through the handles; skipped without them. The
# device session runs these on the H200 (scripts/device-session.sh, section python).
import os

import numpy as np
import pytest

import cutrain

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the NumPy tests cover the CPU path)")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for PyTorch")

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8]


@pytest.fixture(params=[1, 4], ids=["par1", "par4"])
def h(request):
    h = cutrain.aio_handle(1024 * 1024, 32, False, False, request.param)
    yield h
    h.close()


def rand(n, dtype, device="cpu"):
    if dtype.is_floating_point:
        return torch.randn(n, device=device).to(dtype)
    return torch.randint(0, 100, (n,), device=device).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_tensor_round_trip(h, tmp_path, dtype):
    path = str(tmp_path / "t.bin")
    src = rand(1_000_003, dtype)
    assert h.sync_pwrite(src, path) == 1
    assert os.path.getsize(path) == src.numel() * src.element_size()
    dst = torch.zeros_like(src)
    assert h.async_pread(dst, path) == 0 and h.wait() == 1
    assert torch.equal(dst, src)


def test_cpu_non_contiguous(h, tmp_path):
    with pytest.raises(ValueError, match="non-contiguous tensor"):
        h.sync_pwrite(torch.zeros(64, 64).t(), str(tmp_path / "t.bin"))


def test_locked_tensor_is_torch(h, tmp_path):
    ex = torch.empty(0, dtype=torch.bfloat16)
    t = h.new_cpu_locked_tensor(4096 * 3 + 7, ex)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 and t.shape == (4096 * 3 + 7,)
    assert t.data_ptr() % 4096 == 0
    if torch.cuda.is_available():
        assert t.is_pinned()
    t.copy_(rand(t.numel(), torch.bfloat16))  # what a DeepNVMe script does with it
    path = str(tmp_path / "t.bin")
    h.sync_pwrite(t, path)
    back = torch.empty_like(t)
    h.sync_pread(back, path)
    assert torch.equal(back, t)
    assert h.free_cpu_locked_tensor(t)


def test_load_checkpoint_as_torch(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    save = str(tmp_path / "ck")
    cutrain.train(config=os.path.join(root, "configs", "bf16_full.json"), device="cpu", hidden_dim=64, num_layers=1,
                  num_heads=4, vocab_size=256, batch_size=2, seq_length=16, num_steps=2, warmup_steps=1, save=save,
                  quiet=True)
    sd = cutrain.load_checkpoint(save, framework="torch")
    ref = cutrain.load_checkpoint(save, framework="numpy")
    assert set(sd) == set(ref)
    for k, v in sd.items():
        assert isinstance(v, torch.Tensor)
        assert torch.equal(v.float(), torch.from_numpy(ref[k]))
    # load_state_dict takes the names as they are: a module with the same parameter names.
    m = torch.nn.Module()
    m.embedding = torch.nn.Embedding(256, 64).to(sd["embedding.weight"].dtype)
    m.embedding.load_state_dict({"weight": sd["embedding.weight"]})
    assert torch.equal(m.embedding.weight.detach(), sd["embedding.weight"])


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 4095, 12_345_679])
def test_cuda_tensor_round_trip(h, tmp_path, dtype, n):
    path = str(tmp_path / "t.bin")
    src = rand(n, dtype, "cuda")
    assert h.sync_pwrite(src, path) == 1
    dst = torch.full_like(src, 7)
    assert h.sync_pread(dst, path) == 1
    assert torch.equal(dst, src)
    dst.fill_(3)
    assert h.pread(dst, path, False, True) == 0 and h.wait() == 1
    assert torch.equal(dst, src)
    host = torch.empty(n, dtype=dtype)
    h.sync_pread(host, path)
    assert torch.equal(host, src.cpu())


@cuda
def test_cuda_after_pending_kernel(h, tmp_path):
    # The tensor is written by a kernel still in flight on PyTorch's stream: the write must see it.
    path = str(tmp_path / "t.bin")
    x = torch.randn(4096, 4096, device="cuda")
    y = x @ x
    h.sync_pwrite(y, path)
    back = torch.empty_like(y)
    h.sync_pread(back, path)
    assert torch.equal(back, y)


@cuda
def test_cuda_non_contiguous(h, tmp_path):
    with pytest.raises(ValueError, match="non-contiguous tensor"):
        h.sync_pread(torch.zeros(64, 64, device="cuda")[:, ::2], str(tmp_path / "t.bin"))


@cuda
def test_pinned_to_cuda_copy(h, tmp_path):
    # The tutorial's pattern: read into a pinned tensor, copy it to the device.
    path = str(tmp_path / "t.bin")
    src = torch.randn(1 << 20, device="cuda")
    h.sync_pwrite(src, path)
    pinned = h.new_cpu_locked_tensor(src.numel(), src.cpu())
    h.sync_pread(pinned, path)
    dev = torch.empty_like(src)
    dev.copy_(pinned, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(dev, src)
    h.free_cpu_locked_tensor(pinned)


@cuda
def test_gds_handle(tmp_path):
    ok, why = cutrain.gds_available(str(tmp_path))  # the driver, and a file registered in this folder
    if not ok:
        pytest.skip("GPUDirect Storage does not register a file here: " + why)
    g = cutrain.gds_handle(1024 * 1024, 32, False, False, 4)
    path = str(tmp_path / "t.bin")
    src = torch.randn(3 << 20, device="cuda")
    g.pin_device_tensor(src)
    assert g.sync_pwrite(src, path) == 1
    dst = g.new_pinned_device_tensor(src.numel(), src)
    assert g.async_pread(dst, path) == 0 and g.wait() == 1
    assert torch.equal(dst, src)
    g.unpin_device_tensor(src)
    g.free_pinned_device_tensor(dst)
    g.close()


def test_cupy_array(h, tmp_path):
    cp = pytest.importorskip("cupy", reason="CuPy is not installed")
    path = str(tmp_path / "t.bin")
    src = cp.random.standard_normal(100_001, dtype=cp.float32)
    h.sync_pwrite(src, path)
    dst = cp.zeros_like(src)
    h.sync_pread(dst, path)
    assert bool((dst == src).all())


@cuda
@pytest.mark.parametrize("non_blocking", [False, True])
def test_trainer_offload_reload_keeps_the_run(non_blocking):
    # Two trainers on the same batches; one offloads every state between steps and reloads it.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shape = dict(hidden_dim=256, num_layers=2, num_heads=4, vocab_size=1024, batch_size=2, seq_length=64)
    cfg = os.path.join(root, "configs", "bf16_full.json")
    a = cutrain.Trainer(cfg, device="cuda", **shape)
    b = cutrain.Trainer(cfg, device="cuda", **shape)
    assert "optim_states" in a.offloadable_states()
    g = torch.Generator().manual_seed(3)
    la, lb = [], []
    for _ in range(4):
        x = torch.randint(0, 1024, (1, 2, 64), dtype=torch.int32, generator=g)
        y = torch.randint(0, 1024, (1, 2, 64), dtype=torch.int32, generator=g)
        la.append(a.step(x, y)["loss"])
        before = a.memory()["allocated"]
        a.offload_states(non_blocking=non_blocking)
        if not non_blocking:
            assert a.memory()["allocated"] < before
        a.reload_states(non_blocking=non_blocking)
        lb.append(b.step(x, y)["loss"])
    assert la == lb


def test_cpu_import_checks_and_keep_alive(h, tmp_path):
    # A subclass (nn.Parameter) is a tensor too; a temporary given to an async call lives until
    # wait(); a tensor on another device is refused naming it.
    path = str(tmp_path / "t.bin")
    p = torch.nn.Parameter(torch.randn(4099), requires_grad=False)
    assert h.sync_pwrite(p, path) == 1
    assert h.async_pwrite(p.detach().clone() * 2, path) == 0
    assert h.wait() == 1
    back = torch.zeros(4099)
    assert h.sync_pread(back, path) == 1
    assert torch.equal(back, p.detach() * 2)
    with pytest.raises(ValueError, match=r"sync_pwrite: buffer lives on meta"):
        h.sync_pwrite(torch.empty(16, device="meta"), path)
    empty = torch.empty(0)
    assert h.sync_pread(empty, path) == 1 and h.sync_pwrite(empty, path) == 1
