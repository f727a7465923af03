"""PyTorch peer of bench/bench_offload.cpp, same names, done the way DeepSpeed's ZeRO-3
offload_states / reload_states do it:
  offload/roundtrip_pinned/<bytes>@torch    pinned_buf.copy_(gpu) (buffer made once), then .to("cuda")
  offload/roundtrip_pageable/<bytes>@torch  gpu.to("cpu") (a fresh pageable tensor), then .to("cuda")
  offload/raw_<pinned|pageable>/<bytes>@torch  copy_ both ways between fixed buffers
Host-timed around synchronous calls (as the offload example times them); median."""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_util  # noqa: E402


def host_time_us(fn, iters):
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def main():
    res = peer_util.Results(__doc__)
    for nbytes in (256 << 20, 1 << 30, 4 << 30):
        gpu = torch.full((nbytes,), 0x5A, dtype=torch.uint8, device="cuda")
        for pin in (True, False):
            kind = "pinned" if pin else "pageable"
            iters = 3 if res.args.quick else (10 if pin else 3)
            state = {"t": gpu}
            if pin:
                buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

                def roundtrip():
                    buf.copy_(state["t"])
                    state["t"] = buf.to("cuda")
            else:
                def roundtrip():
                    state["t"] = state["t"].to("cpu").to("cuda")
            t = host_time_us(roundtrip, iters)
            res.add(f"offload/roundtrip_{kind}/{nbytes}@torch", t, gbps=round(2 * nbytes / (t * 1e-6) / 1e9, 2))
            host = torch.full((nbytes,), 0x5A, dtype=torch.uint8, pin_memory=pin)

            def raw():
                host.copy_(gpu)
                gpu.copy_(host)
            t = host_time_us(raw, iters)
            res.add(f"offload/raw_{kind}/{nbytes}@torch", t, gbps=round(2 * nbytes / (t * 1e-6) / 1e9, 2))
            del host
        del gpu, state
        torch.cuda.empty_cache()
    res.write()


if __name__ == "__main__":
    main()
