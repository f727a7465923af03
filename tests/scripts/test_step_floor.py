#!/usr/bin/env python3
"""scripts/step_floor.py on a synthetic timing report whose floors are known by hand."""
import json
import os
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "scripts"))
import step_floor  # noqa: E402

# Peaks: GEMM 500 TFLOP/s, copy 2000 GB/s. Leaves per step:
#  fc1  2.0 ms at 250 TFLOP/s -> 0.5e12 FLOPs -> floor 1.0 ms (compute), excess 1.0
#  opt  1.0 ms at 1000 GB/s   -> 1e9 bytes    -> floor 0.5 ms (memory),  excess 0.5
#  mix  1.0 ms at 100 TFLOP/s and 1800 GB/s: 0.2 ms compute vs 0.9 ms memory -> floor 0.9, excess 0.1
#  host 0.3 ms, no cost model: excess 0.3
# step 5.0 ms; leaves 4.3 -> 0.7 ms uncovered. Excess 1.0 + 0.5 + 0.1 + 0.3 + 0.7 = 2.6.
report = {
    "peaks": {"gemm_tflops_measured": 500.0, "copy_gbps": 2000.0, "bf16_dense_tflops_datasheet": 989.4},
    "step_region": "step",
    "regions_by_kind": [
        {"name": "step", "ms_per_step": 5.0, "total_ms": 10.0, "calls": 2},
        {"name": "step/fwd", "ms_per_step": 3.0, "total_ms": 6.0, "calls": 2},
        {"name": "step/fwd/layer*/fc1", "ms_per_step": 2.0, "tflops": 250.0, "frac_gemm_peak": 0.5},
        {"name": "step/fwd/layer*/mix", "ms_per_step": 1.0, "tflops": 100.0, "gbps": 1800.0},
        {"name": "step/optimizer", "ms_per_step": 1.0, "gbps": 1000.0},
        {"name": "step/host", "ms_per_step": 0.3},
    ],
}


def check(cond, what):
    if not cond:
        sys.exit(f"FAILED: {what}")


rows, total = step_floor.floors(report)
by = {n: (ms, f, b) for n, ms, f, b in rows}
check(total == 5.0, f"step time {total}")
check(set(by) == {"step/fwd/layer*/fc1", "step/fwd/layer*/mix", "step/optimizer", "step/host",
                  "(not in any leaf: gaps, host, untimed)"}, f"leaves {sorted(by)}")
check(abs(by["step/fwd/layer*/fc1"][1] - 1.0) < 1e-12 and by["step/fwd/layer*/fc1"][2] == "compute", "fc1 floor")
check(abs(by["step/optimizer"][1] - 0.5) < 1e-12 and by["step/optimizer"][2] == "memory", "optimizer floor")
check(abs(by["step/fwd/layer*/mix"][1] - 0.9) < 1e-12 and by["step/fwd/layer*/mix"][2] == "memory", "mix floor")
check(by["step/host"][1] is None, "a leaf without a cost has no floor")
check(abs(by["(not in any leaf: gaps, host, untimed)"][0] - 0.7) < 1e-12, "uncovered time")

with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "r.json")
    json.dump(report, open(p, "w"))
    out = subprocess.run([sys.executable, os.path.join(root, "scripts", "step_floor.py"), p], capture_output=True,
                         text=True, check=True).stdout
    check("excess 2.600 ms" in out, "total excess in:\n" + out)
    first = out.splitlines()[2]
    check(first.split()[0] == "step/fwd/layer*/fc1", "largest excess first:\n" + out)
    bad = os.path.join(d, "bad.json")
    open(bad, "w").write("{}")
    r = subprocess.run([sys.executable, os.path.join(root, "scripts", "step_floor.py"), bad], capture_output=True,
                       text=True)
    check(r.returncode != 0 and "bad.json" in r.stderr and "timing report" in r.stderr, "bad input: " + r.stderr)
print("step_floor: ok")
