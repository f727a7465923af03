#!/usr/bin/env python3
"""Tests of the benchmark-suite tools on synthetic inputs (no GPU, no pip): bench/merge_runs.py,
bench/compare_runs.py, bench/peers/compare.py (one run and --rounds), and scripts/bench-all.sh
driven by fake bench_* binaries and a fake nvidia-smi."""
import json
import os
import random
import stat
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import compare_runs  # noqa: E402
import merge_runs  # noqa: E402


def load_json(path):
    with open(path) as f:
        return json.load(f)


def gbench_doc(rows, date="2026-12-02T12:00:00+00:00"):
    """A Google Benchmark JSON document: rows of (name, median_us or None for a plain real-time
    benchmark, real_time_ns, extra fields)."""
    bms = []
    for name, med, real_ns, extra in rows:
        b = {"name": name, "run_name": name, "run_type": "iteration", "repetitions": 1, "repetition_index": 0,
             "threads": 1, "iterations": 100, "real_time": real_ns, "cpu_time": real_ns * 1.1, "time_unit": "ns"}
        if med is not None:
            b["median_us"] = med
            b["GB/s"] = 1000.0 / med
        b.update(extra)
        bms.append(b)
    return {"context": {"date": date, "host_name": "h", "library_build_type": "release"}, "benchmarks": bms}


class Scratch(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def write(self, name, obj):
        p = os.path.join(self.dir, name)
        with open(p, "w") as f:
            f.write(obj if isinstance(obj, str) else json.dumps(obj))
        return p

    def run_py(self, script, *args):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), *args], capture_output=True,
                           text=True)
        return r.returncode, r.stdout, r.stderr


class MergeRuns(Scratch):
    def test_names_medians_errors_and_metadata(self):
        rng = random.Random()
        med = rng.uniform(10, 1000)
        a = self.write("bench_x.json", gbench_doc([
            ("x/fwd/128/manual_time", med, 5000.0, {}),
            ("x/bwd/7x9/iterations:10/manual_time", None, 2500.0, {}),
            ("x/skip/1/manual_time", None, 0.0, {"error_occurred": True, "error_message": "no CUDA device"}),
        ]))
        out = os.path.join(self.dir, "run.json")
        rc, so, se = self.run_py("merge_runs.py", "--out", out, "--device", "NVIDIA H200", "--driver", "580.1",
                                 "--commit", "abc123", "--dirty", "--date", "2026-12-02T00:00:00Z",
                                 "--rc", "bench_x=0", "--rc", "bench_crash=139", a)
        self.assertEqual(rc, 0, se)
        run = load_json(out)
        self.assertEqual(run["schema"], "cutrain-bench-run/1")
        self.assertEqual((run["device"], run["driver"], run["commit"], run["dirty"]), ("NVIDIA H200", "580.1", "abc123", True))
        self.assertEqual(run["date"], "2026-12-02T00:00:00Z")
        by = {b["name"]: b for b in run["benchmarks"]}
        self.assertEqual(sorted(by), ["x/bwd/7x9", "x/fwd/128", "x/skip/1"])
        self.assertAlmostEqual(by["x/fwd/128"]["median_us"], med)
        self.assertAlmostEqual(by["x/fwd/128"]["counters"]["GB/s"], 1000.0 / med)
        self.assertAlmostEqual(by["x/bwd/7x9"]["median_us"], 2.5)  # real time in ns -> us
        self.assertEqual(by["x/skip/1"]["error"], "no CUDA device")
        self.assertEqual(by["x/fwd/128"]["binary"], "bench_x")
        self.assertEqual(run["binaries"]["bench_x"]["rc"], 0)
        self.assertEqual(run["binaries"]["bench_x"]["context"]["host_name"], "h")
        self.assertEqual(run["binaries"]["bench_crash"]["rc"], 139)
        self.assertIn("error", run["binaries"]["bench_crash"])
        self.assertEqual([f for f in os.listdir(self.dir) if f.startswith(".")], [])  # no temp litter

    def test_repetitions_keep_the_median_aggregate(self):
        doc = gbench_doc([("r/a/1/manual_time", 10.0, 1.0, {}), ("r/a/1/manual_time", 30.0, 1.0, {})])
        for agg, v in (("mean", 20.0), ("median", 12.0), ("stddev", 1.0)):
            doc["benchmarks"].append({"name": f"r/a/1/manual_time_{agg}", "run_name": "r/a/1/manual_time",
                                      "run_type": "aggregate", "aggregate_name": agg, "real_time": v * 1e3,
                                      "time_unit": "ns", "median_us": v})
        e = merge_runs.entries(doc, "bench_r")
        self.assertEqual(len(e), 1)
        self.assertEqual(e[0]["name"], "r/a/1")
        self.assertEqual(e[0]["median_us"], 12.0)

    def test_unreadable_file_is_reported_not_fatal(self):
        bad = self.write("bench_bad.json", "{ not json")
        good = self.write("bench_ok.json", gbench_doc([("ok/fwd/1", 3.0, 1.0, {})]))
        out = os.path.join(self.dir, "run.json")
        rc, so, se = self.run_py("merge_runs.py", "--out", out, bad, good)
        self.assertEqual(rc, 0, se)
        self.assertIn("bench_bad.json", se)
        run = load_json(out)
        self.assertIn("error", run["binaries"]["bench_bad"])
        self.assertEqual([b["name"] for b in run["benchmarks"]], ["ok/fwd/1"])


class CompareRuns(Scratch):
    def make_run(self, name, medians, commit="c"):
        run = {"schema": "cutrain-bench-run/1", "device": "NVIDIA H200", "driver": "1", "commit": commit,
               "date": "d", "benchmarks": [{"name": n, "median_us": m} if m is not None else
                                           {"name": n, "median_us": 0, "error": "boom"} for n, m in medians]}
        return self.write(name, run)

    def test_flags_only_more_than_threshold_slower(self):
        base = random.Random().uniform(50, 500)
        a = self.make_run("a.json", [("k/fwd/1", base), ("k/fwd/2", base), ("k/fwd/3", base), ("k/bwd/1", base)])
        b = self.make_run("b.json", [("k/fwd/1", base * 1.049), ("k/fwd/2", base * 1.051), ("k/fwd/3", base * 0.8),
                                     ("k/bwd/1", base)])
        rc, so, se = self.run_py("compare_runs.py", a, b)
        self.assertEqual(rc, 1, so + se)
        lines = {l.split("|")[1].strip(): l for l in so.splitlines() if l.startswith("| k/")}
        self.assertIn("SLOWER +5.1%", lines["k/fwd/2"])
        self.assertNotIn("SLOWER", lines["k/fwd/1"])
        self.assertIn("faster", lines["k/fwd/3"])
        self.assertIn("1.05x", lines["k/fwd/2"])
        self.assertIn("1 more than 5% slower", so)
        # The same pair with a looser threshold passes; swapped, the 0.8x one becomes a regression.
        self.assertEqual(self.run_py("compare_runs.py", a, b, "--threshold", "6")[0], 0)
        self.assertEqual(self.run_py("compare_runs.py", b, a)[0], 1)
        self.assertEqual(self.run_py("compare_runs.py", a, a)[0], 0)

    def test_missing_failed_new_and_strict(self):
        a = self.make_run("a.json", [("k/a", 10.0), ("k/gone", 10.0), ("k/broken", 10.0)])
        b = self.make_run("b.json", [("k/a", 10.0), ("k/broken", None), ("k/new", 5.0)])
        rc, so, se = self.run_py("compare_runs.py", a, b)
        self.assertEqual(rc, 0, so + se)
        self.assertIn("missing in B", so)
        self.assertIn("failed in B", so)
        self.assertIn("new in B", so)
        self.assertEqual(self.run_py("compare_runs.py", a, b, "--strict")[0], 1)
        rc, so, _ = self.run_py("compare_runs.py", a, b, "--only-changed")
        self.assertNotIn("| k/a |", so)

    def test_reads_raw_google_benchmark_files_and_rejects_garbage(self):
        a = self.write("bench_g.json", gbench_doc([("g/fwd/64/manual_time", 100.0, 1.0, {})]))
        b = self.make_run("b.json", [("g/fwd/64", 120.0)])
        rc, so, se = self.run_py("compare_runs.py", a, b)
        self.assertEqual(rc, 1, so + se)
        self.assertIn("1.20x", so)
        junk = self.write("junk.json", "[1, 2]")
        rc, so, se = self.run_py("compare_runs.py", junk, b)
        self.assertEqual(rc, 2)
        self.assertIn("junk.json", se)
        rc, so, se = self.run_py("compare_runs.py", os.path.join(self.dir, "nope.json"), b)
        self.assertEqual(rc, 2)
        self.assertIn("nope.json", se)

    def test_rounds_take_the_median_of_each_side_and_show_the_ratio_range(self):
        base = random.Random().uniform(50, 500)
        # k/steady: B is 1% slower in every round; k/noisy: one outlier round on each side that the
        # median ignores; k/slow: 3% slower in every round (over a 2% threshold).
        a_rounds = [("k/steady", base), ("k/noisy", base), ("k/slow", base)]
        b_rounds = [("k/steady", base * 1.01), ("k/noisy", base), ("k/slow", base * 1.03)]
        a1 = self.make_run("a1.json", a_rounds)
        a2 = self.make_run("a2.json", [("k/steady", base), ("k/noisy", base * 2), ("k/slow", base)])
        a3 = self.make_run("a3.json", a_rounds)
        b1 = self.make_run("b1.json", b_rounds)
        b2 = self.make_run("b2.json", b_rounds)
        b3 = self.make_run("b3.json", [("k/steady", base * 1.01), ("k/noisy", base * 3), ("k/slow", base * 1.03)])
        rc, so, se = self.run_py("compare_runs.py", f"{a1},{a2},{a3}", f"{b1},{b2},{b3}", "--threshold", "2")
        self.assertEqual(rc, 1, so + se)
        lines = {l.split("|")[1].strip(): l for l in so.splitlines() if l.startswith("| k/")}
        self.assertIn("3 rounds", so)
        self.assertNotIn("SLOWER", lines["k/steady"])
        self.assertIn("1.010-1.010", lines["k/steady"])
        self.assertNotIn("SLOWER", lines["k/noisy"])
        self.assertIn("1.00x", lines["k/noisy"])
        self.assertIn("0.500-3.000", lines["k/noisy"])  # rounds 2 (base/2base) and 3 (3base/base)
        self.assertIn("SLOWER +3.0%", lines["k/slow"])
        # Unequal round counts and an empty list are usage errors that say so.
        rc, so, se = self.run_py("compare_runs.py", f"{a1},{a2}", b1)
        self.assertEqual(rc, 2)
        self.assertIn("same number", se)
        rc, so, se = self.run_py("compare_runs.py", ",", b1)
        self.assertEqual(rc, 2)
        self.assertIn("no file", se)

    def test_slower_filter_matches_exactly_the_flagged_names(self):
        import re
        a = self.make_run("a.json", [("gemm/fwd_bias+gelu/2x3x4", 10.0), ("k/ok", 10.0), ("k/ok2", 10.0)])
        b = self.make_run("b.json", [("gemm/fwd_bias+gelu/2x3x4", 11.0), ("k/ok", 10.0), ("k/ok2", 12.0)])
        rc, so, se = self.run_py("compare_runs.py", a, b, "--slower-filter")
        self.assertEqual(rc, 0, se)
        rx = re.compile(so.strip())
        self.assertTrue(rx.search("gemm/fwd_bias+gelu/2x3x4/iterations:100/manual_time"))
        self.assertTrue(rx.search("k/ok2"))
        self.assertFalse(rx.search("k/ok"))
        self.assertFalse(rx.search("gemm/fwd_biasgelu/2x3x4"))
        self.assertFalse(rx.search("k/ok22"))
        rc, so, se = self.run_py("compare_runs.py", a, a, "--slower-filter")
        self.assertEqual((rc, so.strip()), (0, ""))

    def test_compare_function_directly(self):
        rows = compare_runs.compare({"x": {"median_us": 1.0}}, {"x": {"median_us": 1.2}}, 5.0)
        self.assertEqual(rows[0][4], "SLOWER")
        self.assertAlmostEqual(rows[0][3], 1.2)


FAKE_BENCH = """#!/bin/sh
# A stand-in bench binary: writes a Google Benchmark JSON to --benchmark_out, records its args.
out=""
for a in "$@"; do case "$a" in --benchmark_out=*) out=${a#--benchmark_out=} ;; esac; done
echo "$@" > "$(dirname "$0")/$(basename "$0").args"
[ -n "$out" ] && cat > "$out" <<JSON
{"context": {"date": "x"}, "benchmarks": [{"name": "@NAME@/fwd/1/manual_time", "run_type": "iteration",
 "real_time": 1000, "time_unit": "ns", "median_us": @MED@}]}
JSON
echo "fake @NAME@ ran"
exit @RC@
"""


class PeerCompare(Scratch):
    """bench/peers/compare.py: ours (Google Benchmark median_us) against a peer (time_us) by name."""

    def round_dir(self, name, ours_us, peer_us):
        d = os.path.join(self.dir, name)
        os.makedirs(d)
        with open(os.path.join(d, "bench_gemm.json"), "w") as f:
            json.dump(gbench_doc([("gemm/fwd/8x8x8/manual_time", ours_us, 1000, {})]), f)
        with open(os.path.join(d, "gemm_peer.json"), "w") as f:
            json.dump({"results": [{"name": "gemm/fwd/8x8x8", "time_us": peer_us},
                                   {"name": "gemm/only_peer/8x8x8", "time_us": 3.0}]}, f)
        return d

    def test_one_run_prints_peer_over_ours(self):
        d = self.round_dir("r1", 10.0, 12.0)
        rc, out, err = self.run_py("peers/compare.py", "--ours", os.path.join(d, "bench_gemm.json"), "--peers",
                                   os.path.join(d, "gemm_peer.json"))
        self.assertEqual(rc, 0, err)
        self.assertIn("| gemm/fwd/8x8x8 | torch | 10.0 | 12.0 | 1.20x |", out)
        self.assertIn("| gemm/only_peer/8x8x8 | torch | (not run) | 3.0 | |", out)

    def test_rounds_give_every_ratio_the_lowest_and_the_median(self):
        dirs = [self.round_dir("r1", 10.0, 12.0), self.round_dir("r2", 10.0, 9.0), self.round_dir("r3", 12.0, 12.0)]
        rc, out, err = self.run_py("peers/compare.py", "--rounds", *dirs)
        self.assertEqual(rc, 0, err)
        self.assertIn("each of 3 rounds", out)
        self.assertIn("| gemm/fwd/8x8x8 | torch | 10.0 | 12.0 | 1.20, 0.90, 1.00 | 0.90x | 1.00x |", out)
        self.assertIn("| gemm/only_peer/8x8x8 | torch | (not run) | 3.0 | | | |", out)

    def test_an_experiment_row_pairs_with_the_same_peer_row(self):
        d = os.path.join(self.dir, "exp")
        os.makedirs(d)
        with open(os.path.join(d, "bench_attention.json"), "w") as f:
            json.dump(gbench_doc([("attention/bwd/B4H16S2048D64/manual_time", 20.0, 1000, {})]), f)
        with open(os.path.join(d, "bench_attention_hopper.json"), "w") as f:
            json.dump(gbench_doc([("attention_hopper/bwd/B4H16S2048D64/manual_time", 10.0, 1000, {})]), f)
        with open(os.path.join(d, "attention_peer.json"), "w") as f:
            json.dump({"results": [{"name": "attention/bwd/B4H16S2048D64@cudnn", "time_us": 15.0},
                                   {"name": "attention/fwd/B4H16S2048D64@cudnn", "time_us": 5.0}]}, f)
        rc, out, err = self.run_py("peers/compare.py", "--ours", os.path.join(d, "bench_attention.json"),
                                   os.path.join(d, "bench_attention_hopper.json"), "--peers",
                                   os.path.join(d, "attention_peer.json"))
        self.assertEqual(rc, 0, err)
        self.assertIn("| attention/bwd/B4H16S2048D64 | cudnn | 20.0 | 15.0 | 0.75x |", out)
        self.assertIn("| attention_hopper/bwd/B4H16S2048D64 | cudnn | 10.0 | 15.0 | 1.50x |", out)
        self.assertIn("| attention/fwd/B4H16S2048D64 | cudnn | (not run) | 5.0 | |", out)
        self.assertNotIn("attention_hopper/fwd/", out)  # an experiment row that was not run is not listed
        rc, out, err = self.run_py("peers/compare.py", "--rounds", d)
        self.assertEqual(rc, 0, err)
        self.assertIn("| attention_hopper/bwd/B4H16S2048D64 | cudnn | 10.0 | 15.0 | 1.50 | 1.50x | 1.50x |", out)
        self.assertNotIn("attention_hopper/fwd/", out)

    def test_a_missing_round_folder_is_named(self):
        rc, out, err = self.run_py("peers/compare.py", "--rounds", os.path.join(self.dir, "nope"))
        self.assertEqual(rc, 2)
        self.assertIn("not a folder", err)
        self.assertIn("nope", err)


class BenchAll(Scratch):
    def fake_build(self, benches):
        bdir = os.path.join(self.dir, "build", "bench")
        os.makedirs(bdir)
        for name, med, rc in benches:
            p = os.path.join(bdir, name)
            with open(p, "w") as f:
                f.write(FAKE_BENCH.replace("@NAME@", name[6:]).replace("@MED@", str(med)).replace("@RC@", str(rc)))
            os.chmod(p, os.stat(p).st_mode | stat.S_IEXEC)
        # Not a benchmark: must be skipped.
        with open(os.path.join(bdir, "bench_notes.txt"), "w") as f:
            f.write("x")
        smi = os.path.join(self.dir, "bin", "nvidia-smi")
        os.makedirs(os.path.dirname(smi))
        with open(smi, "w") as f:
            f.write("#!/bin/sh\necho 'NVIDIA H200, 580.95.05'\n")
        os.chmod(smi, 0o755)
        return os.path.join(self.dir, "build")

    def run_all(self, build, *args):
        env = dict(os.environ, PATH=os.path.join(self.dir, "bin") + os.pathsep + os.environ["PATH"])
        return subprocess.run(["bash", os.path.join(ROOT, "scripts", "bench-all.sh"), "--build", build, *args],
                              capture_output=True, text=True, env=env)

    def test_runs_every_binary_and_merges_with_metadata(self):
        build = self.fake_build([("bench_aaa", 11.5, 0), ("bench_bbb", 22.5, 0)])
        out = os.path.join(self.dir, "run.json")
        r = self.run_all(build, "--out", out, "--filter", "fwd", "--", "--benchmark_repetitions=2")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run = load_json(out)
        self.assertEqual(run["device"], "NVIDIA H200")
        self.assertEqual(run["driver"], "580.95.05")
        self.assertRegex(run["commit"], r"^([0-9a-f]{40}|unknown)$")
        self.assertRegex(run["date"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        self.assertEqual({b["name"]: b["median_us"] for b in run["benchmarks"]}, {"aaa/fwd/1": 11.5, "bbb/fwd/1": 22.5})
        with open(os.path.join(build, "bench", "bench_aaa.args")) as f:
            args = f.read()
        self.assertIn("--benchmark_filter=fwd", args)
        self.assertIn("--benchmark_repetitions=2", args)
        self.assertIn("--benchmark_out_format=json", args)
        # Selecting binaries by name.
        r = self.run_all(build, "--out", out, "--bench", "bbb")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([b["name"] for b in load_json(out)["benchmarks"]], ["bbb/fwd/1"])

    def test_failing_binary_sets_the_exit_code_but_still_merges(self):
        build = self.fake_build([("bench_ok", 1.0, 0), ("bench_bad", 2.0, 3)])
        out = os.path.join(self.dir, "run.json")
        r = self.run_all(build, "--out", out)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("bench_bad exited 3", r.stderr)
        run = load_json(out)
        self.assertEqual(run["binaries"]["bench_bad"]["rc"], 3)
        self.assertEqual(len(run["benchmarks"]), 2)

    def test_usage_errors(self):
        self.assertEqual(self.run_all(os.path.join(self.dir, "nowhere")).returncode, 2)
        build = self.fake_build([("bench_ok", 1.0, 0)])
        self.assertEqual(self.run_all(build, "--bench", "zzz").returncode, 2)
        self.assertEqual(self.run_all(build, "--bogus").returncode, 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
