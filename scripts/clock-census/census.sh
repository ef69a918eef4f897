#!/usr/bin/env bash
# Who reads the host's clock: runs BINARY ARGS... with every clock_gettime counted by the stack
# that called it, and prints the callers, most frequent first (the frames inside std's and
# tokio's clock reading left out). Made to find what makes a turmoil replay differ: there,
# every host's tokio clock is paused, so each remaining read is real time.
#
#   scripts/clock-census/census.sh target/debug/deps/turmoil-<hash> --seed 45 --scenario leader_kill
#
# Run it from where the binary expects to run (the turmoil lane: sim-tests/). Needs cc,
# addr2line and setarch (build-essential, binutils, util-linux).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
binary=$(realpath "$1")
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -shared -fPIC -o "$work/shim.so" "$here/shim.c" -ldl
# Without address randomisation a PIE binary loads at the same base every time.
CLOCK_CENSUS_OUT="$work/out.txt" setarch -R env LD_PRELOAD="$work/shim.so" "$binary" "$@" >"$work/run.log" 2>&1 || true
tail -1 "$work/run.log"
python3 - "$binary" "$work/out.txt" <<'PY'
import re, subprocess, sys
binary, out = sys.argv[1], sys.argv[2]
base = 0x555555554000  # where Linux loads a PIE executable with randomisation off
rows = [line.split() for line in open(out)]
own = sorted({int(a, 16) for row in rows for a in row[1:] if a != "(nil)" and base <= int(a, 16) < 0x7F0000000000})
names = subprocess.run(["addr2line", "-f", "-C", "-e", binary] + [hex(a - base) for a in own],
                       capture_output=True, text=True).stdout.split("\n")
name = {a: names[2 * i] for i, a in enumerate(own)}
clock = re.compile(r"Timespec|clock_gettime|Instant>::now|SystemTime>::now|Instant>::elapsed|time::Instant::now|^\?\?$|^libc$")
callers = {}
for row in rows:
    frames = [re.sub(r"::h[0-9a-f]{16}$", "", name.get(int(a, 16), "libc")) for a in row[1:] if a != "(nil)"]
    frames = [f[:110] for f in frames if not clock.search(f)]
    key = " <- ".join(frames[:4])
    callers[key] = callers.get(key, 0) + int(row[0])
for key, count in sorted(callers.items(), key=lambda kv: -kv[1]):
    print(f"{count:>9}  {key}")
PY
