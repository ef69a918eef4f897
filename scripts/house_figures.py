#!/usr/bin/env python3
"""The shape of the house at a revision (issue 56): lines in core vs io-real, lines of io-real
compiled out of the simulation by module-level madsim gates, module cycles in core, the
core's assertions, the longest functions, ARCHITECTURE.md's size.

    scripts/house_figures.py [REV ...]     # default: the working tree

Each REV is read from `git archive` into a temporary directory, so the tree is untouched.
The incremental rebuild after touching one HTTP handler is timed by scripts/rebuild_http.sh.
"""

import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict


def rust_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("target", "generated")]
        for name in filenames:
            if name.endswith(".rs"):
                yield os.path.join(dirpath, name)


def code_lines(path):
    count = 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            stripped = line.strip()
            if stripped and not stripped.startswith("//"):
                count += 1
    return count


def non_test(text):
    cut = text.find("#[cfg(test)]\nmod tests")
    return text if cut < 0 else text[:cut]


def lines_under(tree, parts, leave_out=()):
    total = 0
    for part in parts:
        for path in rust_files(os.path.join(tree, part)):
            if "/tests/" in path or "/benches/" in path or "/fuzz/" in path:
                continue
            if any(path.startswith(os.path.join(tree, out) + os.sep) for out in leave_out):
                continue
            total += code_lines(path)
    return total


def gated_lines(tree):
    """Lines of io-real modules declared behind `#[cfg(not(madsim))]` (the whole file or dir)."""
    total = 0
    pattern = re.compile(r"#\[cfg\(not\(madsim\)\)\]\s*\n\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_0-9]+)\s*;")
    for path in rust_files(os.path.join(tree, "io-real")):
        text = open(path, encoding="utf-8", errors="replace").read()
        base = os.path.dirname(path)
        stem = os.path.basename(path)[:-3]
        if stem not in ("lib", "main", "mod"):
            base = os.path.join(base, stem)
        for name in pattern.findall(text):
            file = os.path.join(base, name + ".rs")
            folder = os.path.join(base, name)
            if os.path.isfile(file):
                total += code_lines(file)
            if os.path.isdir(folder):
                total += sum(code_lines(p) for p in rust_files(folder))
    return total


def core_cycles(tree):
    root = os.path.join(tree, "core", "src")
    modules = set()
    for name in os.listdir(root):
        if name.endswith(".rs") and name != "lib.rs":
            modules.add(name[:-3])
        elif os.path.isdir(os.path.join(root, name)):
            modules.add(name)
    edges = defaultdict(set)
    for path in rust_files(root):
        rel = os.path.relpath(path, root)
        top = rel.split(os.sep)[0]
        top = top[:-3] if top.endswith(".rs") else top
        if top == "lib" or "/tests/" in path or path.endswith("tests.rs"):
            continue
        for line in non_test(open(path, encoding="utf-8").read()).split("\n"):
            if line.strip().startswith("//"):
                continue
            for target in re.findall(r"crate::([a-z_0-9]+)", line):
                if target in modules and target != top:
                    edges[top].add(target)
    # Tarjan's strongly connected components.
    index, low, stack, on_stack, sccs = {}, {}, [], set(), []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            sccs.append(component)

    sys.setrecursionlimit(10000)
    for node in sorted(modules):
        if node not in index:
            visit(node)
    cycles = [c for c in sccs if len(c) > 1]
    return len(modules), cycles


def assertions(tree):
    count = 0
    pattern = re.compile(r"\b(debug_)?assert(_eq|_ne)?!|const _: \(\) = assert!")
    for path in rust_files(os.path.join(tree, "core", "src")):
        if "/tests/" in path or path.endswith("tests.rs"):
            continue
        count += len(pattern.findall(non_test(open(path, encoding="utf-8").read())))
    return count


def longest_functions(tree, top=5):
    found = []
    head = re.compile(r"^\s*(pub(\([a-z]+\))?\s+)?(async\s+)?(const\s+)?fn\s+([a-z_0-9]+)")
    for part in ("core/src", "io-real"):
        for path in rust_files(os.path.join(tree, part)):
            if "/tests/" in path or path.endswith("tests.rs"):
                continue
            lines = non_test(open(path, encoding="utf-8").read()).split("\n")
            for number, line in enumerate(lines):
                match = head.match(line)
                if not match or line.rstrip().endswith(";"):
                    continue
                depth, opened, end = 0, False, number
                for end in range(number, len(lines)):
                    depth += lines[end].count("{") - lines[end].count("}")
                    opened = opened or "{" in lines[end]
                    if opened and depth <= 0:
                        break
                rel = os.path.relpath(path, tree)
                found.append((end - number + 1, f"{rel}:{number + 1} {match.group(5)}"))
    found.sort(reverse=True)
    return found[:top]


def words(path):
    try:
        return len(open(path, encoding="utf-8").read().split())
    except FileNotFoundError:
        return 0


def report(tree, label):
    core = lines_under(tree, ["core/src"])
    io_real = lines_under(tree, ["io-real"])
    # Since issue 56 the host-only code is in crates nested under io-real: io-real/host and
    # io-real/http, never built in the simulation.
    nested = ["io-real/host", "io-real/http"]
    both = lines_under(tree, ["io-real"], leave_out=nested)
    host_only = lines_under(tree, nested)
    gated = gated_lines(tree)
    modules, cycles = core_cycles(tree)
    in_cycles = sum(len(c) for c in cycles)
    print(f"== {label}")
    print(f"lines: core {core}, io-real {io_real} (io-real/core {io_real / core:.2f})")
    print(f"io-real lines behind module-level madsim gates: {gated} ({100 * gated / io_real:.0f} % of io-real)")
    print(f"io-real crate (both worlds) {both}; host-only crates nested under io-real {host_only}")
    print(f"core modules: {modules}; in a cycle: {in_cycles} in {len(cycles)} cycle(s)")
    print(f"core assertions (non-test): {assertions(tree)}")
    print(f"ARCHITECTURE.md words: {words(os.path.join(tree, 'ARCHITECTURE.md'))}")
    print("longest functions (lines):")
    for length, where in longest_functions(tree):
        print(f"  {length:5} {where}")


def main():
    revs = sys.argv[1:]
    if not revs:
        report(".", "working tree")
        return
    for rev in revs:
        with tempfile.TemporaryDirectory() as tree:
            archive = subprocess.run(["git", "archive", rev], check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
            report(tree, rev)


if __name__ == "__main__":
    main()
