#!/usr/bin/env python3
"""Where ptxas put the wgmma waits of each kernel: the instructions it scheduled between a
`WARPGROUP.DEPBAR.LE gsb0, 0x1` (all but the newest batch retired) and the next
`WARPGROUP.DEPBAR.LE gsb0, 0x0` (every batch retired), counted by kind.

This is the window in which a warpgroup's work runs under its own tensor-core batch (the attention
forward's softmax under P V, the backward's P under dP). ptxas schedules the wait like an
instruction without operands and may hoist it to the top of its basic block, emptying the window
although the PTX keeps the work before it; a zero MUFU count in a softmax loop is that case.

With --turns, also each turn window: the instructions from a `BAR.SYNC` (the ping-pong's named
barrier, where a warpgroup takes its turn) to the first HGMMA after it with no other barrier
between. In the attention forward the other warpgroups' tensor work waits on this stretch, so its
length is part of every tile's critical path (docs/perf-notes.md, desc_advance).

  scripts/sass_wgmma_overlap.py BINARY_OR_CUBIN [--kernel REGEX] [--cuobjdump PATH] [--turns]

Needs cuobjdump (the CUDA toolkit's, or PyPI's nvidia-cuda-cuobjdump wheel). Prints one line per
window: kernel (demangled by c++filt when present, shortened), window index, instructions, MUFU,
HGMMA, FFMA/FMUL/FADD/FMNMX.
"""
import argparse
import re
import shutil
import subprocess
import sys


def sass_functions(binary, cuobjdump):
    out = subprocess.run([cuobjdump, "-sass", binary], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"sass_wgmma_overlap: cuobjdump -sass {binary} failed: {out.stderr.strip()}")
    name, body = None, []
    for line in out.stdout.splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            if name:
                yield name, body
            name, body = m.group(1), []
            continue
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m and name:
            body.append(m.group(1).strip())
    if name:
        yield name, body


def opcode(instr):
    words = instr.split()
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op


def windows(body):
    start = None
    for i, instr in enumerate(body):
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in instr:
            start = i
        elif "WARPGROUP.DEPBAR.LE gsb0, 0x0" in instr and start is not None:
            yield body[start + 1:i]
            start = None


def turn_windows(body):
    """The instructions between each BAR.SYNC and the first HGMMA after it (none if another
    barrier or the function's end comes first)."""
    for i, instr in enumerate(body):
        if not opcode(instr).startswith("BAR.SYNC"):
            continue
        for j in range(i + 1, len(body)):
            op = opcode(body[j])
            if op.startswith("HGMMA"):
                yield body[i + 1:j]
                break
            if op.startswith("BAR."):
                break


def demangle(names):
    if not shutil.which("c++filt"):
        return names
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    return out.splitlines()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--kernel", default="", help="regex on the mangled kernel name")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    ap.add_argument("--turns", action="store_true", help="also print each turn window's length")
    a = ap.parse_args()
    funcs = [(n, b) for n, b in sass_functions(a.binary, a.cuobjdump) if re.search(a.kernel, n)]
    if not funcs:
        sys.exit(f"sass_wgmma_overlap: no kernel of {a.binary} matches '{a.kernel}'")
    names = demangle([n for n, _ in funcs])
    for (_, body), name in zip(funcs, names):
        short = name.replace("(anonymous namespace)::", "")
        short = re.sub(r"\(.*", "", short).replace("cutrain::kernels::", "")[-140:]
        for k, w in enumerate(windows(body)):
            ops = [opcode(x) for x in w]
            count = lambda prefix: sum(o.startswith(prefix) for o in ops)
            fp = sum(count(p) for p in ("FFMA", "FMUL", "FADD", "FMNMX"))
            print(f"{short}  window {k}: {len(w)} instructions, MUFU {count('MUFU')}, "
                  f"HGMMA {count('HGMMA')}, fp32 {fp}")
        if a.turns:
            lengths = [len(w) for w in turn_windows(body)]
            print(f"{short}  turn windows (BAR.SYNC to first HGMMA): {lengths}")


if __name__ == "__main__":
    main()
