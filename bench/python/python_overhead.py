"""What a Python call adds to one small I/O: aio_handle.sync_pread / sync_pwrite of a 4 KiB tensor
called from a Python loop, against the same calls of the C++ engine in a C++ loop
(aio_handle._engine_loop), same handle, same buffer, same file, same process, in alternating
rounds. Prints the median per-call time of each and the median of the rounds' differences (the
target: <= 2 us): pairing each Python round with the C++ round next to it cancels the drift of a
disk's latency, which moves by more than the overhead between rounds.
A second pair of rows times the same calls on an empty tensor, where the engine returns at once:
what is left is the binding's own cost (argument parsing, the tensor import, the file name).

--ab DIR compares two builds of the module in one run: DIR holds the other one (a folder with
cutrain/ in it, e.g. a copy of build/release/python from before a change); processes of the two builds
take turns (alternating which goes first), three rounds of every row apiece, and the table gives
both builds' figures over all their rounds.

    python3 bench/python/python_overhead.py [--folder DIR] [--size 4096] [--iterations 500]
        [--rounds 21] [--torch] [--ab OTHER_PYTHONPATH] [--out FILE.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def python_loop(call, buf, path, n):
    t0 = time.perf_counter()
    for _ in range(n):
        call(buf, path)
    return (time.perf_counter() - t0) / n


OPS = (("sync_pread", True, False), ("sync_pwrite", False, False), ("sync_pread", True, True),
       ("sync_pwrite", False, True))  # (method, read, empty tensor)


def measure(a):
    """Per row: the Python and C++ per-call seconds of each round."""
    import cutrain
    os.makedirs(a.folder, exist_ok=True)
    path = os.path.join(a.folder, "cutrain_overhead.bin")
    h = cutrain.aio_handle(1024 * 1024, 128, False, False, 1)
    buf = h.new_cpu_locked_tensor(a.size, np.zeros(1, dtype=np.uint8))
    if a.torch:
        import torch
        buf = torch.from_numpy(buf)
    buf[:] = 7
    h.sync_pwrite(buf, path)
    rows = []
    for op, read, empty in OPS:
        call = getattr(h, op)
        b = buf[:0] if empty else buf
        python_loop(call, b, path, a.iterations // 4)  # warm-up
        h._engine_loop(b, path, read, a.iterations // 4)
        py, cpp = [], []
        for r in range(a.rounds):
            if r % 2:
                cpp.append(h._engine_loop(b, path, read, a.iterations))
                py.append(python_loop(call, b, path, a.iterations))
            else:
                py.append(python_loop(call, b, path, a.iterations))
                cpp.append(h._engine_loop(b, path, read, a.iterations))
        rows.append(dict(op=op, bytes=int(b.nbytes), py=py, cpp=cpp))
    backend = h.backend
    h.close()
    os.remove(path)
    return rows, backend


def summary(rows):
    out = []
    for r in rows:
        mp, mc = statistics.median(r["py"]), statistics.median(r["cpp"])
        diffs = sorted(p - c for p, c in zip(r["py"], r["cpp"]))
        out.append(dict(op=r["op"], bytes=r["bytes"], python_us=mp * 1e6, cpp_us=mc * 1e6,
                        overhead_us=statistics.median(diffs) * 1e6,
                        overhead_min_us=diffs[0] * 1e6, overhead_max_us=diffs[-1] * 1e6))
    return out


PER_PROCESS = 3  # --ab: rounds per child process


def child(a, pythonpath):
    """PER_PROCESS rounds of every row in a fresh process importing cutrain from `pythonpath` first."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, os.path.abspath(__file__), "--folder", a.folder, "--size", str(a.size), "--iterations",
           str(a.iterations), "--rounds", str(PER_PROCESS), "--raw"] + (["--torch"] if a.torch else [])
    return json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)


def ab(a):
    builds = {"before": a.ab, "after": ""}
    rows = {k: None for k in builds}
    backend = ""
    for r in range((a.rounds + PER_PROCESS - 1) // PER_PROCESS):
        for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
            got, backend = child(a, builds[name])
            if rows[name] is None:
                rows[name] = got
            else:
                for acc, g in zip(rows[name], got):
                    acc["py"] += g["py"]
                    acc["cpp"] += g["cpp"]
    kind = "torch" if a.torch else "numpy"
    print(f"Python call overhead, {a.size} B, {kind} tensor, {a.folder}: before = {a.ab}, after = this PYTHONPATH "
          f"({len(rows['after'][0]['py'])} rounds x {a.iterations} calls each, {PER_PROCESS} rounds per process, the "
          f"builds' processes alternating; backend {backend})")
    print("| op | bytes | before: Python / C++ call (us) | before: overhead (us), range | after: Python / C++ call (us) "
          "| after: overhead (us), range |")  # overhead: the median of the rounds' differences
    print("|---|---:|---:|---:|---:|---:|")
    sb, sa = summary(rows["before"]), summary(rows["after"])
    for b, f in zip(sb, sa):
        print(f"| {b['op']} | {b['bytes']} | {b['python_us']:.2f} / {b['cpp_us']:.2f} | {b['overhead_us']:.2f} "
              f"({b['overhead_min_us']:.2f} .. {b['overhead_max_us']:.2f}) | {f['python_us']:.2f} / {f['cpp_us']:.2f} | "
              f"{f['overhead_us']:.2f} ({f['overhead_min_us']:.2f} .. {f['overhead_max_us']:.2f}) |")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(dict(tensor=kind, folder=a.folder, before=sb, after=sa), fh, indent=1)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default="/tmp")
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--iterations", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--torch", action="store_true", help="a torch CPU tensor instead of NumPy")
    ap.add_argument("--ab", metavar="OTHER_PYTHONPATH", help="compare with the module found there (see above)")
    ap.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)  # --ab's child: JSON of the rounds
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.ab:
        return ab(a)
    raw, backend = measure(a)
    if a.raw:
        json.dump([raw, backend], sys.stdout)
        return 0
    rows = summary(raw)
    kind = "torch" if a.torch else "numpy"
    print(f"Python call overhead, {a.size} B, {kind} tensor, {a.folder} ({a.rounds} rounds x {a.iterations} calls, "
          f"backend {backend})")
    print("| op | bytes | Python call (us) | C++ engine call (us) | overhead (us) | overhead range over rounds |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['op']} | {r['bytes']} | {r['python_us']:.2f} | {r['cpp_us']:.2f} | {r['overhead_us']:.2f} | "
              f"{r['overhead_min_us']:.2f} .. {r['overhead_max_us']:.2f} |")
    worst = max(r["overhead_us"] for r in rows[:2])
    binding = max(r["overhead_us"] for r in rows[2:])
    print(f"target <= 2 us over the C++ call at {a.size} B: {'met' if worst <= 2.0 else 'MISSED'} (worst median "
          f"{worst:.2f} us); the binding alone (empty tensor): {binding:.2f} us")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(tensor=kind, folder=a.folder, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
