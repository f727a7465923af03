#!/usr/bin/env python3
"""Regression check between two benchmark runs: each benchmark's median in A (the baseline) and
B (the candidate), the ratio B/A, and a flag on every benchmark more than --threshold percent
(default 5) slower in B. Exit code 1 when something regressed (or, with --strict, when a
benchmark of A is missing or failed in B), 0 otherwise, 2 on unreadable input.

    compare_runs.py A.json B.json [--threshold 5] [--strict] [--only-changed]
    compare_runs.py A1.json,A2.json,A3.json B1.json,B2.json,B3.json ...

--slower-filter prints only a --benchmark_filter regex matching the flagged (SLOWER) benchmarks,
an empty line when none is flagged: the input of a re-run of just those rows in more rounds.

With comma-separated lists, each side is several rounds of the same benchmarks (run alternately
in one session, as scripts/device-session.sh's `against` section does): a benchmark's figure is
the median over the rounds of its per-round median, the verdict is taken on that, and the table
adds the range of the per-round ratios B_i/A_i (rounds paired by position).

A and B are files written by scripts/bench-all.sh (bench/merge_runs.py), or plain Google
Benchmark --benchmark_out JSON files. The median is the "median_us" counter every cutrain
benchmark reports (bench/support/bench_support.h), else the benchmark's real time."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import merge_runs  # noqa: E402


def load(path):
    """(metadata, {name: entry}) from a merged run or a raw Google Benchmark file."""
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or "benchmarks" not in doc:
        raise ValueError("neither a bench-all run nor a Google Benchmark output (no 'benchmarks' list)")
    if doc.get("schema", "").startswith("cutrain-bench-run/"):
        meta = {k: doc.get(k, "") for k in ("device", "driver", "commit", "date")}
        items = doc["benchmarks"]
    else:
        ctx = doc.get("context", {})
        meta = {"device": "", "driver": "", "commit": "", "date": ctx.get("date", "")}
        items = merge_runs.entries(doc, os.path.basename(path))
    out = {}
    for e in items:
        if "name" not in e:
            raise ValueError(f"a benchmark entry without a name: {e!r}")
        out[e["name"]] = e
    return meta, out


def median(e):
    if e is None or e.get("error"):
        return None
    v = e.get("median_us")
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def median_of(values):
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    n = len(vals)
    return vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])


def combine(rounds):
    """{name: entry} of one side from its rounds: an entry whose median_us is the median over the
    rounds where it ran (an error only where it failed in every round), with the per-round medians
    kept under "rounds"."""
    out = {}
    for r in rounds:
        for name in r:
            if name not in out:
                per = [median(x.get(name)) for x in rounds]
                m = median_of(per)
                out[name] = {"name": name, "rounds": per}
                if m is None:
                    out[name]["error"] = "failed in every round"
                else:
                    out[name]["median_us"] = m
    return out


def ratio_range(ea, eb):
    """(lowest, highest) per-round ratio B_i/A_i over the rounds where both ran, or None."""
    if not ea or not eb or "rounds" not in ea or "rounds" not in eb:
        return None
    rs = [b / a for a, b in zip(ea["rounds"], eb["rounds"]) if a and b]
    return (min(rs), max(rs)) if rs else None


_ERE_SPECIAL = set(".[]{}()\\*+?|^$")


def name_filter(names):
    """A --benchmark_filter regex (POSIX extended, as Google Benchmark matches it) that matches
    exactly these benchmark names, with or without the /iterations:.../manual_time suffix."""
    esc = ["".join("\\" + c if c in _ERE_SPECIAL else c for c in n) for n in names]
    return f"^({'|'.join(esc)})(/|$)" if esc else ""


def compare(a, b, threshold_pct):
    """Rows (name, a_us, b_us, ratio, status) in A's order then B's new ones; status is one of
    "", "SLOWER", "faster", "missing in B", "new in B", "failed in A", "failed in B"."""
    rows = []
    limit = 1.0 + threshold_pct / 100.0
    for name in list(a) + [n for n in b if n not in a]:
        ea, eb = a.get(name), b.get(name)
        ma, mb = median(ea), median(eb)
        ratio = mb / ma if ma and mb else None
        if ea is None:
            status = "new in B"
        elif eb is None:
            status = "missing in B"
        elif ma is None:
            status = "failed in A"
        elif mb is None:
            status = "failed in B"
        elif ratio > limit:
            status = "SLOWER"
        elif ratio < 1.0 / limit:
            status = "faster"
        else:
            status = ""
        rows.append((name, ma, mb, ratio, status))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="baseline run (or comma-separated rounds)")
    ap.add_argument("b", help="candidate run (or comma-separated rounds)")
    ap.add_argument("--threshold", type=float, default=5.0, help="percent slower that counts as a regression")
    ap.add_argument("--strict", action="store_true", help="a benchmark missing or failed in B also fails")
    ap.add_argument("--only-changed", action="store_true", help="print only flagged rows")
    ap.add_argument("--slower-filter", action="store_true",
                    help="print only a --benchmark_filter regex of the SLOWER rows (empty line if none)")
    args = ap.parse_args(argv)
    if args.threshold < 0:
        print("compare_runs: --threshold must be >= 0", file=sys.stderr)
        return 2
    sides = []
    for arg in (args.a, args.b):
        paths = [p for p in arg.split(",") if p]
        runs = []
        for path in paths:
            try:
                runs.append(load(path))
            except (OSError, ValueError) as e:
                print(f"compare_runs: {path}: {e}", file=sys.stderr)
                return 2
        if not runs:
            print(f"compare_runs: no file in '{arg}'", file=sys.stderr)
            return 2
        sides.append((paths, runs))
    if len(sides[0][0]) != len(sides[1][0]):
        print(f"compare_runs: A has {len(sides[0][0])} rounds and B {len(sides[1][0])}: give both the same "
              "number", file=sys.stderr)
        return 2
    rounds = len(sides[0][0])
    (meta_a, a), (meta_b, b) = [(runs[0][0], runs[0][1] if rounds == 1 else combine([r[1] for r in runs]))
                                for _, runs in sides]
    if args.slower_filter:
        print(name_filter([r[0] for r in compare(a, b, args.threshold) if r[4] == "SLOWER"]))
        return 0
    for tag, (paths, _), m in (("A", sides[0], meta_a), ("B", sides[1], meta_b)):
        print(f"{tag}: {', '.join(paths)}  device={m['device'] or '?'} driver={m['driver'] or '?'} "
              f"commit={m['commit'] or '?'} date={m['date'] or '?'}")
    if rounds > 1:
        print(f"{rounds} rounds: each figure is the median over the rounds; the range is B_i/A_i per round")
    if meta_a["device"] and meta_b["device"] and meta_a["device"] != meta_b["device"]:
        print(f"warning: different devices ({meta_a['device']} vs {meta_b['device']}): ratios compare hardware too")
    rows = compare(a, b, args.threshold)
    print()
    extra_head, extra_rule = (" rounds B/A |", "---:|") if rounds > 1 else ("", "")
    print(f"| benchmark | A median (us) | B median (us) | B/A |{extra_head} |")
    print(f"|---|---:|---:|---:|{extra_rule}---|")
    fmt = lambda v: f"{v:.2f}" if v is not None else "-"
    for name, ma, mb, ratio, status in rows:
        if args.only_changed and not status:
            continue
        flag = f"**SLOWER {100 * (ratio - 1):+.1f}%**" if status == "SLOWER" else status
        extra = ""
        if rounds > 1:
            rr = ratio_range(a.get(name), b.get(name))
            extra = f" {rr[0]:.3f}-{rr[1]:.3f} |" if rr else " - |"
        print(f"| {name} | {fmt(ma)} | {fmt(mb)} | {fmt(ratio) + 'x' if ratio else '-'} |{extra} {flag} |")
    slower = [r for r in rows if r[4] == "SLOWER"]
    lost = [r for r in rows if r[4] in ("missing in B", "failed in B")]
    print()
    print(f"{len(rows)} benchmarks: {len(slower)} more than {args.threshold:g}% slower, "
          f"{sum(r[4] == 'faster' for r in rows)} faster, {len(lost)} missing or failed in B")
    if slower or (args.strict and lost):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
