#!/usr/bin/env python3
"""The profiling readers on hand-written inputs: scripts/sass_wgmma_overlap.py's window finders on a
SASS body, scripts/ncu_summary.py's stall reasons on an ncu details report."""
import os
import sys

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "scripts"))
import ncu_summary  # noqa: E402
import sass_wgmma_overlap as sw  # noqa: E402

body = [
    "BAR.SYNC.DEFER_BLOCKING R3, R4",          # turn 1: 2 instructions, then HGMMA
    "R2UR UR4, R10",
    "@P0 IADD3 R5, R5, 0x1, RZ",
    "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0",
    "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24, gsb0",
    "WARPGROUP.DEPBAR.LE gsb0, 0x1",            # overlap window: 3 instructions
    "MUFU.EX2 R6, R7",
    "FFMA R8, R9, R10, R11",
    "FMNMX R12, R13, R14, !PT",
    "WARPGROUP.DEPBAR.LE gsb0, 0x0",
    "BAR.SYNC.DEFER_BLOCKING R3, R4",           # another barrier before any HGMMA: no window
    "MOV R1, R2",
    "BAR.ARV R5, 0x80",
    "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0",
    "BAR.SYNC.DEFER_BLOCKING R3, R4",           # turn 2: empty window
    "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0",
    "BAR.SYNC.DEFER_BLOCKING R3, R4",           # no HGMMA before the end: no window
    "EXIT",
]

assert sw.opcode("@P0 IADD3 R5, R5, 0x1, RZ") == "IADD3"
assert sw.opcode("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0").startswith("HGMMA")
turns = [len(w) for w in sw.turn_windows(body)]
assert turns == [2, 0], turns
overlap = list(sw.windows(body))
assert [len(w) for w in overlap] == [3], overlap
assert [sw.opcode(x) for x in overlap[0]] == ["MUFU.EX2", "FFMA", "FMNMX"], overlap

# The stall lines of a details report (other metric lines, units and thousands separators around).
report = """
    Section: Command line profiler metrics
    ---------------------------------------------------------------------- ----------- ------------
    dram__bytes_read.sum                                                         Mbyte       824.18
    smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio             ratio         1.25
    smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio     ratio         3.50
    smsp__average_warps_issue_stalled_wait_per_issue_active.ratio                ratio     1,000.70
    smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio      ratio          n/a
"""
got = ncu_summary.stalls(report)
assert got == [("wait", 1000.7), ("long_scoreboard", 3.5), ("barrier", 1.25)], got
assert ncu_summary.stalls("no metrics here") == []
assert ncu_summary.STALL_METRICS.startswith("regex:^smsp__average_warps_issue_stalled_")
print("profile tools: ok")
