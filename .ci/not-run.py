#!/usr/bin/env python3
"""The tests of a CTest JUnit file (ctest --output-junit) that did not run: skipped
(SKIP_RETURN_CODE), not run (no executable, a fixture that failed) or disabled. Prints
one line, "NAME (reason), ...", with the reason the test printed last (every skip path
of the suite prints one line saying why), or nothing when every test ran.

usage: not-run.py JUNIT.xml
"""
import sys
import xml.etree.ElementTree as ET


def reason(case):
    out = [l.strip() for l in (case.findtext("system-out") or "").splitlines() if l.strip()]
    skipped = case.find("skipped")
    said = skipped.get("message", "") if skipped is not None else case.get("status", "")
    said = said.replace("SKIP_RETURN_CODE=", "exit ")
    if not out or said in out[-1]:
        return out[-1] if out else said
    return f"{said}: {out[-1]}"


def main():
    cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
    gone = [f"{c.get('name')} ({reason(c)})" for c in cases if c.get("status") not in ("run", "fail")]
    if gone:
        print(", ".join(gone))


if __name__ == "__main__":
    main()
