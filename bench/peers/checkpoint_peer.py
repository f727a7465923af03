"""PyTorch peer of cutrain's checkpoint save and load: the tensors of a cutrain step folder (its
model.safetensors and optimizer.safetensors: the same names, dtypes and shapes, random values)
made on the GPU, saved with `torch.save` (one file per state dict, as DeepSpeed writes the model
and optimizer states) and loaded with `torch.load(map_location="cuda")`. Same definitions as
cutrain's figures: a save ends when the files are on the device (os.fsync), every load starts with
the files' pages dropped from the page cache (POSIX_FADV_DONTNEED) and ends when the tensors are on
the GPU. Host-timed, median of --reps.

With --cutrain_log FILE (the output of `cutrain train` runs with a sync save and a --resume), the
table puts cutrain's figures beside these: the sync save (snapshot + write) and the resume
(manifest, files with checksums, into the GPU). --drop_cache DIR only drops the page cache of DIR's files (before a cutrain
resume) and exits."""
import argparse
import json
import os
import re
import statistics
import struct
import sys
import time

DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "I32": "int32"}


def drop_cache(path):
    for root, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return h


def cutrain_figures(logs):
    """Median seconds of cutrain's sync saves (snapshot + write) and of its resumes (manifest,
    files with checksums, into the GPU) found in the logs, with their counts."""
    saves, loads = [], []
    for path in logs:
        for line in open(path, errors="replace"):
            m = re.search(r"checkpoint: ([0-9.]+) GB written in ([0-9.]+) s \(([0-9.]+) GB/sec\), snapshot ([0-9.]+) s", line)
            if m:
                saves.append(float(m.group(2)) + float(m.group(4)))
            m = re.search(r"checkpoint: ([0-9.]+) GB read in ([0-9.]+) s", line)
            if m:
                loads.append(float(m.group(2)))
    med = lambda v: (statistics.median(v), len(v)) if v else None
    return med(saves), med(loads)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--like", help="a cutrain step folder (DIR/global_step<N>)")
    ap.add_argument("--dir", default="/tmp/cutrain_checkpoint_peer", help="where torch.save writes")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cutrain_log", nargs="*", default=[])
    ap.add_argument("--drop_cache", help="drop the page cache of this folder's files and exit")
    ap.add_argument("--out", help="JSON results")
    a = ap.parse_args()
    if a.drop_cache:
        drop_cache(a.drop_cache)
        return 0
    if not a.like:
        ap.error("--like DIR/global_step<N> is required")
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    states, nbytes = {}, 0
    for name in ("model", "optimizer"):
        sd = {}
        for k, v in header(os.path.join(a.like, name + ".safetensors")).items():
            dt = getattr(torch, DTYPES[v["dtype"]])
            sd[k] = torch.randn(v["shape"], generator=gen, device="cuda", dtype=torch.float32).to(dt)
            nbytes += sd[k].numel() * sd[k].element_size()
        states[name] = sd
    torch.cuda.synchronize()
    os.makedirs(a.dir, exist_ok=True)
    paths = {n: os.path.join(a.dir, n + ".pt") for n in states}

    def save():
        for n, sd in states.items():
            with open(paths[n], "wb") as f:
                torch.save(sd, f)
                f.flush()
                os.fsync(f.fileno())

    def load():
        out = [torch.load(paths[n], map_location="cuda") for n in states]
        torch.cuda.synchronize()
        return out

    saves, loads = [], []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        save()
        saves.append(time.perf_counter() - t0)
        drop_cache(a.dir)
        t0 = time.perf_counter()
        got = load()
        loads.append(time.perf_counter() - t0)
        del got
    file_bytes = sum(os.path.getsize(p) for p in paths.values())
    s, l = statistics.median(saves), statistics.median(loads)
    gib = float(1 << 30)
    print(f"checkpoint peer: {len(states['model'])} + {len(states['optimizer'])} tensors, {nbytes / gib:.2f} GB of "
          f"tensors, {file_bytes / gib:.2f} GB of files, median of {a.reps}")
    print(f"torch.save + fsync: {s:.3f} s ({file_bytes / s / gib:.2f} GB/sec)")
    print(f"torch.load (cold): {l:.3f} s ({file_bytes / l / gib:.2f} GB/sec)")
    rows = {"tensor_bytes": nbytes, "file_bytes": file_bytes, "torch_save_s": s, "torch_load_s": l,
            "torch_save_all_s": saves, "torch_load_all_s": loads}
    if a.cutrain_log:
        cs, cl = cutrain_figures(a.cutrain_log)
        print("| operation | torch | cutrain | cutrain / torch (speed) |")
        print("|---|---:|---:|---:|")
        if cs:
            print(f"| sync save (cutrain: snapshot + write, median of {cs[1]}) | {s:.3f} s | {cs[0]:.3f} s | {s / cs[0]:.2f}x |")
            rows["cutrain_save_s"] = cs[0]
        if cl:
            print(f"| load (cutrain: verify + load) | {l:.3f} s | {cl[0]:.3f} s | {l / cl[0]:.2f}x |")
            rows["cutrain_load_s"] = cl[0]
    for p in paths.values():
        os.remove(p)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
