#!/usr/bin/env python3
"""check.py's report after each part: a check killed partway (a device lease that runs
out, a command past its timeout) still leaves in --out the results of the parts it
finished. Two stand-in parts run in a child process: the first records a result, the
second kills the process as a timeout's SIGKILL would (os._exit, no cleanup); the
report on disk must hold the first part's result."""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
import check

def finished(c):
    c.record("first", "a part that finished", "ok", "recorded before the kill")

def killed(c):
    os._exit(137)

check.preflight = lambda c: True
check.PARTS = {"first": finished, "second": killed}
sys.argv = ["check.py", "--amsp", "-", "--mpiexec", "-", "--inputs", "-", "--data", "-", "--gpus", "1",
            "--out", sys.argv[2], "--parts", "first,second"]
sys.exit(check.main())
"""


def main():
    with tempfile.TemporaryDirectory() as out:
        rc = subprocess.run([sys.executable, "-c", CHILD, HERE, out]).returncode
        if rc != 137:
            sys.exit(f"FAIL: the stand-in check exited {rc}, not 137 (the kill)")
        path = os.path.join(out, "gpu-check.json")
        if not os.path.exists(path):
            sys.exit("FAIL: a check killed after its first part left no gpu-check.json in --out")
        results = json.load(open(path))["results"]
        if [(r["part"], r["result"]) for r in results] != [("first", "ok")]:
            sys.exit(f"FAIL: the report on disk holds {results}, not the first part's result")
        md = open(os.path.join(out, "gpu-check.md")).read()
        if "| first | a part that finished | ok |" not in md:
            sys.exit("FAIL: gpu-check.md lacks the finished part's row")
    print("ok: a check killed after its first part leaves that part's result in gpu-check.md and .json")


if __name__ == "__main__":
    main()
