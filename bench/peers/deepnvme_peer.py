"""DeepNVMe's tutorial operations through cutrain's Python handle and DeepSpeed's (its async_io op)
in the same process: the same script, changing only which AsyncIOBuilder it loads.

1. check: one set of assertions (DeepNVMe's return values, the bytes on disk and back, pinned
   tensors, CUDA tensors, file offsets, getters) run against each handle; both must pass.
2. bench: a --size tensor (default 1 GiB) stored and loaded, from a CPU pinned tensor
   (new_cpu_locked_tensor) and from a CUDA tensor, blocking (sync_pwrite / sync_pread) and
   non-blocking (async_* + wait), intra_op_parallelism 1 and 4. Each row runs --reps times per
   side after one warm-up, the two sides interleaved within every repetition (ours then
   DeepSpeed's, or the other way round, alternating per repetition); a load starts with the
   file's pages dropped (both sides use O_DIRECT); GB/s is 1024^3 bytes/s of the median time. The
   table gives ours/DeepSpeed per row, and the spread of the repetitions' own ratios (each
   repetition's two runs paired) with how many of them ours won: a row whose ratios straddle 1.0
   is undecided at that many repetitions. The two sides take turns on two files (swapped every
   other repetition, so over 4 repetitions each side runs first and second on each file): on the
   CPU machine the same handle on both sides stored 5-20% faster into one of two files of the same
   folder, a difference that followed the file and not the handle.

    .peers/run.sh ds-python bench/peers/deepnvme_peer.py --folder /tmp/dnvme [--size 1G] [--reps 8]
        [--impl both|cutrain|deepspeed|aa] [--no-bench] [--out FILE.json]
--impl aa runs cutrain's handle on both sides (the second called cutrain_again): the rig's own
spread, the ratio a row shows with no difference between the sides.
(cutrain importable: PYTHONPATH with the installed wheel; scripts/device-session.sh --only python.)
"""
import argparse
import json
import os
import statistics
import sys
import time
import traceback

import torch

BLOCK, DEPTH = 1024 * 1024, 128


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def builder(impl):
    if impl in ("cutrain", "cutrain_again"):
        from cutrain import AsyncIOBuilder
    else:
        # DeepSpeed 0.19.8's JIT builder parses each TORCH_CUDA_ARCH_LIST entry as major.minor
        # integers and fails on Hopper's "9.0a"; async_io has no device code, so the plain
        # capability of the device is enough.
        major, minor = torch.cuda.get_device_capability()
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
        from deepspeed.ops.op_builder import AsyncIOBuilder
    return AsyncIOBuilder().load()


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# ---- 1. the same assertions against each handle ----
def check(op, folder, cuda):
    """Returns a list of (name, error) for the checks that failed."""
    failures = []
    h = op.aio_handle(BLOCK, DEPTH, False, False, 2)
    path = os.path.join(folder, "check.bin")
    n = 3 * BLOCK + 4096  # several blocks; a multiple of the O_DIRECT unit, as DeepSpeed needs

    def case(name, fn):
        try:
            fn()
        except Exception:
            failures.append((name, traceback.format_exc(limit=2)))

    def getters():
        assert h.get_block_size() == BLOCK and h.get_queue_depth() == DEPTH
        assert h.get_single_submit() is False and h.get_overlap_events() is False
        assert h.get_intra_op_parallelism() == 2

    def pinned_sync():
        src = h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))
        src.copy_(torch.randint(0, 256, (n,), dtype=torch.uint8))
        assert h.is_pinned(src) and not h.is_pinned(torch.empty(16, dtype=torch.uint8))
        assert h.sync_pwrite(src, path) == 1
        assert os.path.getsize(path) == n
        with open(path, "rb") as f:
            assert f.read() == src.numpy().tobytes()
        dst = h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))
        dst.zero_()
        assert h.sync_pread(dst, path) == 1
        assert torch.equal(dst, src)
        assert h.free_cpu_locked_tensor(src) and h.free_cpu_locked_tensor(dst)

    def plain_async():
        src = torch.randn(n // 4)
        assert h.async_pwrite(src, path) == 0
        assert h.wait() == 1
        dst = torch.zeros_like(src)
        assert h.async_pread(dst, path) == 0
        assert h.wait() == 1
        assert torch.equal(dst, src)

    def combined():
        src = torch.randn(n // 4)
        assert h.pwrite(src, path, False, False) == 1
        dst = torch.zeros_like(src)
        assert h.pread(dst, path, False, True) == 0
        assert h.wait() == 1
        assert torch.equal(dst, src)

    def offset():
        a, b = torch.randn(BLOCK // 4), torch.randn(BLOCK // 4)
        h.sync_pwrite(a, path)
        h.sync_pwrite(b, path, BLOCK)
        got = torch.zeros_like(b)
        h.sync_pread(got, path, BLOCK)
        assert torch.equal(got, b)

    def device():
        src = torch.randn(n // 4, device="cuda")
        assert h.sync_pwrite(src, path) == 1
        dst = torch.zeros_like(src)
        assert h.sync_pread(dst, path) == 1
        assert torch.equal(dst, src)
        dst.zero_()
        assert h.async_pread(dst, path) == 0 and h.wait() == 1
        torch.cuda.synchronize()
        assert torch.equal(dst, src)

    for name, fn in (("getters", getters), ("pinned_sync", pinned_sync), ("plain_async", plain_async),
                     ("pread_pwrite", combined), ("file_offset", offset)) + ((("cuda", device),) if cuda else ()):
        case(name, fn)
    os.remove(path)
    return failures


# ---- 2. the tutorial's operations, timed ----
ROWS = [(op, mem, mode, par) for op in ("store", "load") for mem in ("cpu_pinned", "cuda")
        for mode in ("blocking", "non-blocking") for par in (1, 4)]


def run_row(h, op, mode, buf, path):
    if op == "load":
        drop_cache(path)
    t0 = time.perf_counter()
    if mode == "blocking":
        (h.sync_pread if op == "load" else h.sync_pwrite)(buf, path)
    else:
        (h.async_pread if op == "load" else h.async_pwrite)(buf, path)
        h.wait()
    if buf.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def bench(ops, folder, size, reps, cuda):
    src = torch.randint(0, 256, (size,), dtype=torch.uint8)
    handles = {(impl, par): op.aio_handle(BLOCK, DEPTH, False, False, par) for impl, op in ops.items() for par in (1, 4)}
    bufs = {}
    for impl in ops:
        pinned = handles[(impl, 1)].new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
        pinned.copy_(src)
        bufs[(impl, "cpu_pinned")] = pinned
        if cuda:
            bufs[(impl, "cuda")] = src.to("cuda")
    # Both files hold `src` once the store rows ran, so a load may read the one the other side stored.
    files = [os.path.join(folder, f"side{k}.bin") for k in range(len(ops))]
    results = []
    for i, (op, mem, mode, par) in enumerate(ROWS):
        if mem == "cuda" and not cuda:
            continue
        times = {impl: [] for impl in ops}
        order = list(ops) if i % 2 == 0 else list(reversed(list(ops)))
        for rep in range(reps + 1):
            swap = (rep // 2) % 2  # which side gets which file; the order flips every repetition
            for impl in (order if rep % 2 == 0 else list(reversed(order))):
                path = files[(list(ops).index(impl) + swap) % len(files)]
                t = run_row(handles[(impl, par)], op, mode, bufs[(impl, mem)], path)
                if rep > 0:
                    times[impl].append(t)
        row = dict(op=op, tensor=mem, mode=mode, intra_op_parallelism=par, seconds=times)
        for impl in ops:
            row[impl] = size / statistics.median(times[impl]) / 2**30
        line = f"  {op} {mem} {mode} par{par}: " + ", ".join(f"{k} {row[k]:.2f} GB/s" for k in ops)
        if len(ops) == 2:  # each repetition's ours/DeepSpeed: the same repetition's two runs
            first, second = list(ops)
            paired = [d / c for c, d in zip(times[first], times[second])]
            row["rep_ratios"] = paired
            line += f", per repetition {min(paired):.2f}x .. {max(paired):.2f}x, ours ahead in " \
                    f"{sum(r > 1.0 for r in paired)}/{len(paired)}"
        results.append(row)
        print(line, flush=True)
    # What was loaded last is what was stored: the bytes came back on both sides.
    bad = [k for k, b in bufs.items() if not torch.equal(b.cpu(), src)]
    for (impl, _), h in handles.items():
        if impl.startswith("cutrain"):
            h.close()
    for path in files:
        os.remove(path)
    return results, bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default="/tmp/deepnvme_peer")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--impl", default="both", choices=["both", "cutrain", "deepspeed", "aa"])
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    os.makedirs(a.folder, exist_ok=True)
    cuda = torch.cuda.is_available()
    impls = {"both": ["cutrain", "deepspeed"], "aa": ["cutrain", "cutrain_again"]}.get(a.impl, [a.impl])
    ops = {impl: builder(impl) for impl in impls}
    rc = 0
    for impl, op in ops.items():
        failures = check(op, a.folder, cuda)
        total = 5 + (1 if cuda else 0)
        print(f"check {impl}: {total - len(failures)}/{total} passed")
        for name, err in failures:
            print(f"  FAILED {name}:\n{err}")
        rc |= bool(failures)
    if a.no_bench:
        return rc
    size = parse_size(a.size)
    print(f"bench: {size} bytes, block {BLOCK}, queue depth {DEPTH}, median of {a.reps} after a warm-up, {a.folder}")
    rows, bad = bench(ops, a.folder, size, a.reps, cuda)
    if bad:
        print(f"bench: the bytes loaded differ from those stored for {bad}")
        rc = 1
    head = "| op | tensor | mode | intra_op_parallelism | " + " | ".join(f"{k} GB/s" for k in impls)
    if len(impls) == 2:
        head += " | ours/DeepSpeed | per repetition | ours ahead" if a.impl == "both" else \
            f" | {impls[0]}/{impls[1]} | per repetition | first ahead"
    print(head + " |")
    print("|---|---|---|---:|" + "---:|" * (len(impls) + 3 * (len(impls) == 2)))
    for r in rows:
        line = f"| {r['op']} | {r['tensor']} | {r['mode']} | {r['intra_op_parallelism']} | " + \
            " | ".join(f"{r[k]:.2f}" for k in impls)
        if len(impls) == 2:
            r["ratio"] = r[impls[0]] / r[impls[1]]
            p = r["rep_ratios"]
            line += f" | {r['ratio']:.2f}x | {min(p):.2f}x .. {max(p):.2f}x | {sum(x > 1.0 for x in p)}/{len(p)}"
        print(line + " |")
    if a.impl == "both":
        low = [r for r in rows if r["ratio"] < 1.0]
        print(f"target ours >= 1.0x DeepSpeed on every row: {'met' if not low else 'MISSED'} "
              f"({len(rows) - len(low)}/{len(rows)} rows)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(size=size, reps=a.reps, rows=rows), f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
