#!/usr/bin/env bash
# The BF16 example's run_comparison.sh + gather_memory.py + plot_loss.py in one: runs `cutrain train`
# with baseline / bf16_master_wg / bf16_full and the same arguments and seed, then prints
#   Configuration | Allocated Memory | Peak Memory | Avg Step Time
# with the reduction against baseline, the bytes-per-parameter table, and draws the loss curves
# into $OUT/loss_comparison.png when matplotlib is there. --with-peer also runs the PyTorch peer
# (bench/peers/train_peer.py, eager and torch.compile) on the same arguments.
#
#   scripts/run-comparison.sh [--with-peer] [--bin build/release/tools/cutrain] [train flags...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bin=build/release/tools/cutrain; peer=0; args=()
while (($#)); do
  case "$1" in
    --with-peer) peer=1; shift ;;
    --bin) bin=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
[ -x "$bin" ] || { echo "run-comparison: $bin not found (build first or pass --bin)" >&2; exit 1; }
out=${OUT:-$root/build/comparison}
mkdir -p "$out"
configs=(baseline bf16_master_wg bf16_full)
for c in "${configs[@]}"; do
  echo "== cutrain train --deepspeed_config configs/$c.json ${args[*]:-}"
  "$bin" train --deepspeed_config "configs/$c.json" --loss_log_file "$out/loss_$c.csv" "${args[@]}" | tee "$out/$c.log"
  if ((peer)); then
    for mode in ${PEER_MODES:-eager compile}; do  # PEER_MODES=eager skips torch.compile (minutes)
      flag=(); [ $mode = compile ] && flag=(--compile)
      python3 bench/peers/train_peer.py --deepspeed_config "configs/$c.json" --loss_log_file "$out/loss_${c}_torch_$mode.csv" \
          "${flag[@]}" "${args[@]}" | tee "$out/${c}_torch_$mode.log" || echo "peer $c $mode failed"
    done
  fi
done
"$bin" train --print_layouts | tee "$out/layouts.txt"
python3 - "$out" "$peer" <<'PY'
import glob, os, re, sys
out, peer = sys.argv[1], sys.argv[2] == "1"
rows = []
names = ["baseline", "bf16_master_wg", "bf16_full"]
labels = [(n, f"{n}.log") for n in names]
if peer:
    labels += [(f"{n} (torch {m})", f"{n}_torch_{m}.log") for n in names for m in ("eager", "compile")]
for label, f in labels:
    p = os.path.join(out, f)
    if not os.path.exists(p):
        continue
    m = re.search(r"SUMMARY: config=\S+ params=(\d+) peak_mem_bytes=(\d+) alloc_mem_bytes=(\d+) avg_step_time=([\d.]+)",
                  open(p).read())
    if m:
        rows.append((label, int(m[3]), int(m[2]), float(m[4])))
gb = lambda b: f"{b / 1024 ** 3:.2f} GB"
print("\nConfiguration            | Allocated Memory | Peak Memory | Avg Step Time")
print("-------------------------|------------------|-------------|--------------")
for label, a, pk, t in rows:
    print(f"{label:<25}| {gb(a):>16} | {gb(pk):>11} | {t:.4f}s")
base = next((r for r in rows if r[0] == "baseline"), None)
if base:
    print("\nChange against baseline (negative: less memory):")
    for label, a, pk, t in rows:
        if label != "baseline" and base[1] and base[2]:
            change = lambda x, b: f"{100 * (x / b - 1):+.1f}%"  # signed: a rise reads "+", not "--"
            print(f"  {label}: allocated {change(a, base[1])}, peak {change(pk, base[2])}"
                  + (f", step time {t / base[3]:.2f}x" if base[3] else ""))
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.figure(figsize=(8, 5))
    for f in sorted(glob.glob(os.path.join(out, "loss_*.csv"))):
        lines = open(f).read().split("\n")[1:]
        pts = [tuple(map(float, l.split(","))) for l in lines if l]
        plt.plot([p[0] for p in pts], [p[1] for p in pts], label=os.path.basename(f)[5:-4])
    plt.xlabel("step"); plt.ylabel("loss"); plt.legend(); plt.title("Loss comparison")
    plt.savefig(os.path.join(out, "loss_comparison.png"), dpi=120)
    print(f"\nLoss plot: {os.path.join(out, 'loss_comparison.png')}")
except ImportError:
    print("\n(matplotlib not available: no loss plot)")
PY
