#!/usr/bin/env python3
"""Prints the README's simulation commands, one per line: LANE<TAB>ARGS.

LANE is `both` for `cargo test -p sim-tests -- ARGS` (cargo hands ARGS to both lanes' binaries)
and `turmoil` for `cargo test -p sim-tests --test turmoil -- ARGS`. scripts/test.sh runs each
through the lanes with --dry-run, so every command the README shows parses and routes.
"""
import re
import shlex
import sys

readme = open(sys.argv[1] if len(sys.argv) > 1 else "README.md").read()
section = readme[readme.index("## The simulation lane"):readme.index("## Fuzzing")]
for line in section.splitlines():
    line = line.split("#", 1)[0].strip()
    if not line.startswith("cargo test -p sim-tests"):
        continue
    words = shlex.split(line)
    rest = words[4:]
    lane = "both"
    if rest[:2] == ["--test", "turmoil"]:
        lane, rest = "turmoil", rest[2:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    elif rest:
        sys.exit(f"cannot read the README command {line!r}")
    print(lane + "\t" + " ".join(rest))
