#!/usr/bin/env python3
"""The `llmc` device section's table: llm.c's and cutrain's logs of the same call side by side,
each target marked met or missed.

  llmc_compare.py --logs DIR

DIR holds the section's logs: llmc_train.txt (llm.c from its d12 init, -o), llmc_parity.txt
(cutrain's validation loss of that checkpoint), llmc_200.txt / cutrain_200.txt (200 steps of
the same recipe from the checkpoint), llmc_speed_b{16,32}.txt / cutrain_speed_b{16,32}.txt
cutrain_speed_r_b{16,32}.txt (--recompute_gelu) and cutrain_speed_f_b{16,32}.txt (--attention_backward
fast) (throughput runs) with their *.mem files (peak nvidia-smi memory.used, MiB, minus the idle
figure before the run).
"""
import argparse
import os
import re
import statistics


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def llmc_val_losses(text):
    return [float(x) for x in re.findall(r"^val loss ([0-9.]+)", text, re.M)]


def llmc_step_losses(text):
    # "step   12/200 | loss 7.123456 (...)| norm ... | 31.45 ms | ... | 508000 tok/s"
    return {int(s): float(l) for s, l in re.findall(r"^step\s+(\d+)/\d+ \| loss ([0-9.]+)", text, re.M)}


def llmc_avg_ms(text):
    m = re.search(r"total average iteration time: ([0-9.]+) ms", text)
    return float(m.group(1)) if m else None


def cutrain_evals(text):
    return [float(x) for x in re.findall(r"Eval [^:]*: val_loss=([0-9.]+)", text)]


def cutrain_step_losses(text):
    return {int(s): float(l) for s, l in re.findall(r"Step (\d+): loss=([0-9.]+)", text)}


def cutrain_avg_s(text):
    # The final results' milliseconds (to 1e-4 ms) where the run prints them, else SUMMARY's
    # seconds (to 1e-4 s: 0.3% steps at 31 ms).
    m = re.search(r"Mean step time: ([0-9.]+) ms", text)
    if m:
        return float(m.group(1)) / 1e3
    m = re.search(r"avg_step_time=([0-9.]+)", text)
    return float(m.group(1)) if m else None


def mem(path):
    t = read(path).split()
    return float(t[0]) if t else None


def mark(ok):
    return "met" if ok else "MISSED"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--logs", required=True)
    ap.add_argument("--epoch", type=int, default=13, help="steps averaged at the end (one pass over the data)")
    a = ap.parse_args()
    L = lambda n: os.path.join(a.logs, n)
    rows = []

    lv = llmc_val_losses(read(L("llmc_train.txt")))
    cv = cutrain_evals(read(L("llmc_parity.txt")))
    if lv and cv:
        d = abs(cv[0] - lv[-1])
        rows.append(f"parity: llm.c val loss {lv[-1]:.6f}, cutrain on its checkpoint {cv[0]:.4f}: "
                    f"|diff| {d:.2e} (target <= 1e-3: {mark(d <= 1e-3)})")
    else:
        rows.append(f"parity: missing numbers (llm.c val {lv}, cutrain eval {cv})")

    ls = llmc_step_losses(read(L("llmc_200.txt")))
    cs = cutrain_step_losses(read(L("cutrain_200.txt")))
    if ls and cs:
        # llm.c numbers its steps from 1; cutrain from 0.
        l_last, c_last = ls[max(ls)], cs[max(cs)]
        rel = abs(c_last - l_last) / l_last
        rows.append(f"200 steps: training loss at the last step llm.c {l_last:.4f}, cutrain {c_last:.4f}: "
                    f"{100 * rel:.2f}% (target <= 1%: {mark(rel <= 0.01)})")
        lm = statistics.mean(ls[k] for k in sorted(ls)[-a.epoch:])
        cm = statistics.mean(cs[k] for k in sorted(cs)[-a.epoch:])
        rows.append(f"200 steps: mean training loss of the last {a.epoch} steps llm.c {lm:.4f}, cutrain {cm:.4f}: "
                    f"{100 * abs(cm - lm) / lm:.2f}% (about one pass over the data)")
        # Both draw llm.c's batches in llm.c's order (--data_order llmc): step by step the same batch.
        common = [k for k in sorted(ls) if k - 1 in cs]
        if common:
            diffs = {k: abs(cs[k - 1] - ls[k]) / ls[k] for k in common}
            worst = max(diffs, key=diffs.get)
            marks = ", ".join(f"{k}: {100 * diffs[k]:.2f}%" for k in (1, 50, 100, 150, 200) if k in diffs)
            rows.append(f"200 steps: per-step |diff| (llm.c's step numbers) {marks}; largest {100 * diffs[worst]:.2f}% "
                        f"at step {worst} (llm.c {ls[worst]:.4f}, cutrain {cs[worst - 1]:.4f})")
        lv2 = llmc_val_losses(read(L("llmc_200.txt")))
        cv2 = cutrain_evals(read(L("cutrain_200.txt")))
        if lv2 and cv2:
            rows.append(f"200 steps: val loss after, llm.c {lv2[-1]:.4f}, cutrain {cv2[-1]:.4f}: "
                        f"{100 * abs(cv2[-1] - lv2[-1]) / lv2[-1]:.2f}%")
    else:
        rows.append(f"200 steps: missing numbers (llm.c {len(ls)} steps, cutrain {len(cs)} steps)")

    for b in (16, 32):
        ms = llmc_avg_ms(read(L(f"llmc_speed_b{b}.txt")))
        lm = mem(L(f"llmc_speed_b{b}.mem"))
        for tag, what in (("", "cutrain"), ("r_", "cutrain --recompute_gelu"),
                          ("f_", "cutrain --attention_backward fast")):
            s = cutrain_avg_s(read(L(f"cutrain_speed_{tag}b{b}.txt")))
            cm = mem(L(f"cutrain_speed_{tag}b{b}.mem"))
            if ms and s:
                lt, ct = b * 1024 / (ms / 1e3), b * 1024 / s
                r = ct / lt
                line = (f"speed d12 B{b} T1024: llm.c {lt:,.0f} tok/s ({ms:.2f} ms), {what} {ct:,.0f} tok/s "
                        f"({1e3 * s:.2f} ms): {r:.3f}x (target >= 1.18x: {mark(r >= 1.18)})")
            else:
                line = f"speed d12 B{b}: missing numbers (llm.c {ms} ms, {what} {s} s)"
            if lm and cm:
                line += f"; peak memory llm.c {lm / 1024:.2f} GiB, {what} {cm / 1024:.2f} GiB (target <=: {mark(cm <= lm)})"
            rows.append(line)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
