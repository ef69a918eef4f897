#!/usr/bin/env python3
"""What holds a running agent's resident memory, page by page (issue 19 section 5).

    scripts/rss_pages.py PID [TOP]

Prints each mapping's resident kilobytes (from /proc/PID/smaps), then, for the resident pages
of the agent binary's own mappings (read from /proc/PID/pagemap, which needs root), which
crates' code or data they hold: each resident page is charged to the symbols (from `nm`) it
overlaps, in proportion, and grouped by crate. Code that ran once at start-up shows up here as
well as code that runs while idle; both count in RSS.
"""

import bisect
import collections
import os
import re
import struct
import subprocess
import sys

PAGE = os.sysconf("SC_PAGE_SIZE")


def mappings(pid):
    """(start, end, offset, path, rss_kb, anon_kb) for every mapping of the process."""
    out = []
    current = None
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) ([0-9a-f]+) \S+ \d+\s*(.*)$", line)
            if head:
                current = {
                    "start": int(head.group(1), 16),
                    "end": int(head.group(2), 16),
                    "perms": head.group(3),
                    "offset": int(head.group(4), 16),
                    "path": head.group(5).strip() or "[anon]",
                    "rss": 0,
                    "anon": 0,
                }
                out.append(current)
            elif line.startswith("Rss:"):
                current["rss"] = int(line.split()[1])
            elif line.startswith("Anonymous:"):
                current["anon"] = int(line.split()[1])
    return out


def resident_pages(pid, start, end):
    """Addresses of the pages of [start, end) that are present in memory."""
    pages = []
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        pagemap.seek(start // PAGE * 8)
        data = pagemap.read((end - start) // PAGE * 8)
    for i in range(len(data) // 8):
        (entry,) = struct.unpack_from("<Q", data, i * 8)
        if entry >> 63 & 1:
            pages.append(start + i * PAGE)
    return pages


def symbols(binary):
    """Sorted (file-relative address, size, crate) of the binary's sized symbols."""
    nm = subprocess.run(
        ["nm", "--demangle", "--print-size", "--defined-only", binary],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    out = []
    for line in nm.splitlines():
        sized = re.match(r"^([0-9a-f]+) ([0-9a-f]+) \S (.*)$", line)
        if sized:
            out.append((int(sized.group(1), 16), int(sized.group(2), 16), crate_of(sized.group(3))))
    out.sort()
    return out


def crate_of(name):
    name = name.lstrip("<&*(")
    if name.startswith("_<"):
        name = name[2:]
    match = re.match(r"([A-Za-z_][A-Za-z0-9_]*)::", name)
    return match.group(1) if match else "(other)"


def load_bias(binary, maps):
    """The run-time address minus the link-time address of the binary's segments."""
    first = min(m["start"] - m["offset"] for m in maps)
    # A position-independent executable links from 0; a fixed one from its first segment.
    with open(binary, "rb") as elf:
        elf_type = elf.read(18)[16]
    return first if elf_type == 3 else 0


def main():
    pid = int(sys.argv[1])
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    maps = mappings(pid)
    binary = os.readlink(f"/proc/{pid}/exe")
    by_path = collections.Counter()
    anon = 0
    for m in maps:
        by_path[m["path"]] += m["rss"]
        anon += m["anon"]
    print(f"pid {pid}: {sum(by_path.values())} kB resident, {anon} kB anonymous")
    for path, kb in by_path.most_common(12):
        print(f"  {kb:>8} kB  {path}")
    own = [m for m in maps if m["path"] == binary]
    if not own:
        return
    bias = load_bias(binary, own)
    syms = symbols(binary)
    starts = [s[0] for s in syms]
    charged = collections.Counter()
    for m in own:
        kind = "code" if "x" in m["perms"] else "data"
        for page in resident_pages(pid, m["start"], m["end"]):
            lo, hi = page - bias, page - bias + PAGE
            i = max(bisect.bisect_right(starts, lo) - 1, 0)
            covered = 0
            while i < len(syms) and syms[i][0] < hi:
                addr, size, crate = syms[i]
                overlap = min(hi, addr + size) - max(lo, addr)
                if overlap > 0:
                    charged[(kind, crate)] += overlap
                    covered += overlap
                i += 1
            if covered < PAGE:
                charged[(kind, "(no symbol)")] += PAGE - covered
    total = sum(charged.values())
    print(f"the binary's resident pages: {total // 1024} kB, by crate:")
    for (kind, crate), size in charged.most_common(top):
        print(f"  {size // 1024:>8} kB  {kind:<4}  {crate}")


if __name__ == "__main__":
    main()
