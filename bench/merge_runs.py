#!/usr/bin/env python3
"""Merges the Google Benchmark JSON files of one suite run (one per bench_* binary) into one
document with the run's metadata: device name, driver, git commit, date.

    merge_runs.py --out run.json [--device NAME] [--driver VER] [--commit SHA] [--dirty] \
                  [--date ISO] [--rc bench_x=RC ...] bench_a.json bench_b.json ...

Output ("cutrain-bench-run/1"): {"schema", "device", "driver", "commit", "dirty", "date", "host",
"binaries": {binary: {"rc", "context", "file"}}, "benchmarks": [{"name", "binary", "median_us",
"real_time_us", "counters", "error"}]}. A benchmark's name is its Google Benchmark name without
the "/manual_time", "/real_time" and "/iterations:N" suffixes (the names bench/peers use)."""
import argparse
import json
import os
import re
import socket
import sys
import tempfile

SCHEMA = "cutrain-bench-run/1"
_SUFFIX = re.compile(r"(/manual_time|/real_time|/iterations:\d+|/repeats:\d+|/threads:\d+)+$")
_UNIT_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
_STD_KEYS = {"name", "family_index", "per_family_instance_index", "run_name", "run_type", "repetitions",
             "repetition_index", "threads", "iterations", "real_time", "cpu_time", "time_unit",
             "aggregate_name", "aggregate_unit", "error_occurred", "error_message", "skipped",
             "skip_message", "label"}


def clean_name(name):
    return _SUFFIX.sub("", name)


def entries(doc, binary):
    """One entry per benchmark of a Google Benchmark document (the median aggregate when the run
    had repetitions, else the single run)."""
    by_name = {}
    for b in doc.get("benchmarks", []):
        run_type = b.get("run_type", "iteration")
        if run_type == "aggregate" and b.get("aggregate_name") != "median":
            continue
        name = clean_name(b.get("run_name", b["name"]) if run_type == "aggregate" else b["name"])
        unit = _UNIT_US.get(b.get("time_unit", "ns"), 1e-3)
        counters = {k: v for k, v in b.items() if k not in _STD_KEYS and isinstance(v, (int, float))}
        e = {"name": name, "binary": binary, "real_time_us": b.get("real_time", 0.0) * unit, "counters": counters}
        e["median_us"] = counters.get("median_us", e["real_time_us"])
        if b.get("error_occurred") or b.get("skipped"):
            e["error"] = b.get("error_message") or b.get("skip_message") or "skipped"
        # A median aggregate replaces the per-repetition rows of the same name.
        if run_type == "aggregate" or name not in by_name:
            by_name[name] = e
    return list(by_name.values())


def write_atomic(path, text):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="unknown")
    ap.add_argument("--driver", default="unknown")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--dirty", action="store_true")
    ap.add_argument("--date", default="")
    ap.add_argument("--rc", action="append", default=[], help="binary=exit code of that binary")
    ap.add_argument("files", nargs="*")
    a = ap.parse_args(argv)
    rcs = {}
    for item in a.rc:
        name, _, rc = item.partition("=")
        rcs[name] = int(rc) if rc.lstrip("-").isdigit() else rc
    run = {"schema": SCHEMA, "device": a.device, "driver": a.driver, "commit": a.commit, "dirty": a.dirty,
           "date": a.date, "host": socket.gethostname(), "binaries": {}, "benchmarks": []}
    for path in a.files:
        binary = os.path.basename(path)
        binary = binary[:-5] if binary.endswith(".json") else binary
        info = {"file": path, "rc": rcs.get(binary)}
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            info["error"] = f"unreadable benchmark output: {e}"
            print(f"merge_runs: {path}: {info['error']}", file=sys.stderr)
            run["binaries"][binary] = info
            continue
        info["context"] = doc.get("context", {})
        run["binaries"][binary] = info
        run["benchmarks"] += entries(doc, binary)
    # Binaries that never wrote a file (crashed before the first benchmark) still show up.
    for binary, rc in rcs.items():
        run["binaries"].setdefault(binary, {"file": None, "rc": rc, "error": "no benchmark output"})
    write_atomic(a.out, json.dumps(run, indent=1, sort_keys=False) + "\n")
    print(f"merge_runs: {len(run['benchmarks'])} benchmarks from {len(run['binaries'])} binaries -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
