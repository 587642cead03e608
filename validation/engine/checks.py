"""What the engine's job tests share: their four arguments and a fresh work folder, and
the check lines they print ("ok  " or "FAIL" and the text), ending with "N passed, M
failed"."""

import argparse
import os
import shutil


def job_args():
    """--amsp, --data, --work (emptied) and --mpiexec."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--amsp", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--mpiexec", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    return args


class Checks:
    """check(ok, text) prints one line; finish() the summary and the exit status (1 on any
    failure, or when nothing was checked)."""

    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, ok, text):
        print(f"{'ok  ' if ok else 'FAIL'} {text}", flush=True)
        self.passed += bool(ok)
        self.failed += not ok

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed")
        return 1 if self.failed or not self.passed else 0
