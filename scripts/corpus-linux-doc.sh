#!/usr/bin/env bash
# A corpus larger than WikiText-2 (0.5M tokens) for scripts/data_efficiency_quality.py --corpus:
# the English reStructuredText sources of the Linux kernel's documentation, as Debian ships them
# in its linux-doc-<version> package (usr/share/doc/linux-doc-<version>/html/_sources/**/*.rst.txt,
# the translations/ folder left out). linux-doc-6.12 (6.12.118-1~deb12u1): 3,147 files, 24.7 MB,
# about 6M GPT-2 tokens. Licence: the kernel's, GPL-2 (Debian's copyright file for the package,
# copied beside the archive); a few documentation files carry a dual or other free licence on
# their SPDX line. Debian main, so free to redistribute; nothing of it is committed here.
#
# Downloads the package by name with `apt-get download` (Debian's archive must be reachable: run
# it here before a device call, never at build time) and writes OUT/linux-doc.tar.xz (about 5.6 MB,
# carried to the device by scripts/device-snapshot.sh inside .devdata/) and OUT/linux-doc.copyright.
#   scripts/corpus-linux-doc.sh [--out DIR (default .devdata)] [--package NAME (default: the newest linux-doc-N.M)]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/.devdata; pkg=""
while (($#)); do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --package) pkg=$2; shift 2 ;;
    *) echo "corpus-linux-doc: unknown option '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [ -z "$pkg" ]; then
  pkg=$(apt-cache search --names-only '^linux-doc-[0-9]+\.[0-9]+$' | awk '{print $1}' | sort -V | tail -1)
  [ -n "$pkg" ] || { echo "corpus-linux-doc: no linux-doc-N.M package in apt's lists (run apt-get update first)" >&2; exit 1; }
fi
mkdir -p "$out" && out=$(cd "$out" && pwd)  # absolute: the archive is written from inside the package
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "$pkg" >/dev/null 2>&1) || { echo "corpus-linux-doc: apt-get download $pkg failed" >&2; exit 1; }
deb=$(ls "$work"/*.deb)
dpkg-deb -x "$deb" "$work/x"
src=$(ls -d "$work"/x/usr/share/doc/linux-doc-*/html/_sources)
n=$(cd "$src" && find . -name '*.rst.txt' -not -path './translations/*' | wc -l)
(cd "$src" && find . -name '*.rst.txt' -not -path './translations/*' | LC_ALL=C sort | tar -c -T - | xz -T0 -6 >"$out/linux-doc.tar.xz.tmp")
mv "$out/linux-doc.tar.xz.tmp" "$out/linux-doc.tar.xz"
cp "$(dirname "$(dirname "$src")")/copyright" "$out/linux-doc.copyright"
echo "corpus-linux-doc: $(basename "$deb"): $n English .rst.txt files -> $out/linux-doc.tar.xz ($(du -h "$out/linux-doc.tar.xz" | cut -f1))"
