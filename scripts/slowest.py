#!/usr/bin/env python3
"""Prints the slowest tests of a nextest JUnit report: scripts/slowest.py FILE [N]."""
import sys
import xml.etree.ElementTree as ET

path = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 10
cases = []
for suite in ET.parse(path).getroot().iter("testsuite"):
    for case in suite.iter("testcase"):
        cases.append((float(case.get("time", "0")), suite.get("name", "?"), case.get("name", "?")))
cases.sort(reverse=True)
print(f"slowest {min(count, len(cases))} of {len(cases)} tests:")
for secs, binary, name in cases[:count]:
    print(f"  {secs:7.1f} s  {binary} {name}")
