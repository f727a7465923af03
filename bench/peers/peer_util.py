"""Shared timing for the PyTorch peers: CUDA events after warm-up, an L2 flush before every timed
call, the median of many. Results are written as JSON {"device":..., "results":[{"name", "time_us",
...}]} with names following bench/support/bench_support.h ("<family>/<direction>/<shape>")."""
import argparse
import json
import statistics
import sys

import torch

_flush_buf = None


def flush_l2():
    global _flush_buf
    if _flush_buf is None:
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
        _flush_buf = torch.empty(max(4 * l2, 64 << 20), dtype=torch.uint8, device="cuda")
    _flush_buf.fill_(0x5A)


def time_us(fn, iters=50, warmup=5, flush=True):
    """Median microseconds of fn() over `iters` event-timed calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        if flush:
            flush_l2()
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def copy_bandwidth_gbps():
    n = 2 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(7)
    b = torch.empty_like(a)
    t = time_us(lambda: b.copy_(a), iters=15, warmup=3, flush=False)
    return 2 * n / (t * 1e-6) / 1e9


class Results:
    def __init__(self, description):
        p = argparse.ArgumentParser(description=description)
        p.add_argument("--out", default=None, help="write results as JSON here")
        p.add_argument("--quick", action="store_true", help="fewer iterations")
        self.args = p.parse_args()
        self.rows = []
        if not torch.cuda.is_available():
            print("peer: no CUDA device", file=sys.stderr)
            sys.exit(2)
        self.iters = 10 if self.args.quick else 50

    def add(self, name, time_us, **extra):
        row = {"name": name, "time_us": time_us, **extra}
        self.rows.append(row)
        print(f"{name:48s} {time_us:12.2f} us " + " ".join(f"{k}={v}" for k, v in extra.items()), flush=True)

    def write(self):
        doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": self.rows}
        if self.args.out:
            with open(self.args.out + ".tmp", "w") as f:
                json.dump(doc, f, indent=1)
            import os
            os.replace(self.args.out + ".tmp", self.args.out)
