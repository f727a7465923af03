"""Python peer of `cutrain file-access` (DeepNVMe's deepnvme/file_access baseline): a 1 GiB uint8
tensor stored with a plain buffered `f.write(...)` of its bytes and loaded with `f.read()` +
`torch.frombuffer` (then `.to("cuda")` for a GPU tensor; a GPU store goes through `.cpu()`).
Same definitions as cutrain's table: a store ends when the data is on the device (fdatasync; the
figure without it, page cache only, is printed beside it) and every load starts with the file's
pages dropped from the page cache (fdatasync + POSIX_FADV_DONTNEED). Host-timed, median of
--loops. Prints a table and writes JSON rows {"op", "gbps", "gbps_no_sync"} with --out."""
import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore", message="The given buffer is not writable")


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def median_s(loops, fn, before=None):
    samples = []
    for _ in range(loops):
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--folder", default="/tmp", help="where the file goes (put it on the drive to measure)")
    p.add_argument("--size", type=int, default=1 << 30, help="tensor bytes")
    p.add_argument("--loops", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if not os.path.isdir(a.folder):
        sys.exit(f"file_access_peer: --folder '{a.folder}' is not a directory")
    path = os.path.join(a.folder, "file_access_peer.bin")
    gen = torch.Generator().manual_seed(1)
    cpu = torch.randint(0, 256, (a.size,), dtype=torch.uint8, generator=gen)
    gpu = cpu.to("cuda") if torch.cuda.is_available() else None
    rows = []

    def store(t, sync):
        def run():
            if os.path.exists(path):
                os.remove(path)
            with open(path, "wb") as f:
                f.write(t.numpy(force=True))  # .cpu() first for a GPU tensor
                if sync:
                    f.flush()
                    os.fdatasync(f.fileno())
        return run

    def load(to_gpu):
        def run():
            with open(path, "rb") as f:
                t = torch.frombuffer(f.read(), dtype=torch.uint8)  # no extra copy (read-only bytes)
            if to_gpu:
                t = t.to("cuda")
                torch.cuda.synchronize()
            assert t.numel() == a.size
        return run

    for name, t in (("CPU", cpu), ("GPU", gpu)):
        if t is None:
            continue
        s_sync = median_s(a.loops, store(t, True))
        s_nosync = median_s(a.loops, store(t, False))
        rows.append({"op": f"store {name} tensor", "gbps": a.size / s_sync / 1e9, "gbps_no_sync": a.size / s_nosync / 1e9})
        store(t, True)()
        s = median_s(a.loops, load(name == "GPU"), before=lambda: drop_cache(path))
        rows.append({"op": f"load {name} tensor", "gbps": a.size / s / 1e9, "gbps_no_sync": None})
    os.remove(path)
    print(f"| operation (Python, {a.size} bytes) | GB/s | GB/s without fdatasync |\n|---|---:|---:|")
    for r in rows:
        ns = "" if r["gbps_no_sync"] is None else f"{r['gbps_no_sync']:.2f}"
        print(f"| {r['op']} | {r['gbps']:.2f} | {ns} |")
    if a.out:
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0) if gpu is not None else "cpu", "size": a.size,
                       "folder": a.folder, "rows": rows}, f, indent=1)
        os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
