#!/usr/bin/env python3
"""The mutation harness (validation/mutate.py) bites: run on a toy tree of a few files.

  - a mutation its check fails on with the expected message is caught;
  - a check that crashes with another message, passes or times out has missed its
    mutation, and any miss makes the harness exit 1;
  - a mutation whose text no longer applies (absent, or present twice), selected or
    not, fails the harness before anything is built or run;
  - a check that fails on the unmutated copy (the control) fails the harness, naming it;
  - an expected message that the passing control already prints fails the harness;
  - a mutated copy that does not build is a harness error, not a catch.

usage: mutate_test.py   (needs cmake and git; about 15 s)
Prints one line per case and ends with "N passed, M failed".
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# The toy tree: a "build" that fails on a syntax error in value.txt, and a check
# that the value is 42.
TREE = {
    ".gitignore": "build/\n",
    "CMakeLists.txt": "cmake_minimum_required(VERSION 3.20)\nproject(toy NONE)\n"
                      "add_custom_target(toy COMMAND sh ${CMAKE_SOURCE_DIR}/build.sh ${CMAKE_SOURCE_DIR})\n",
    "build.sh": "! grep -q syntax-error \"$1/value.txt\" || { echo 'value.txt: syntax error'; exit 1; }\n",
    "value.txt": "42\n",
    "notes.txt": "nothing checks this file\n",
    "check.sh": "v=$(cat value.txt)\n"
                "if [ \"$v\" = hang ]; then sleep 60; fi\n"
                "if [ \"$v\" = crash ]; then kill -SEGV $$; fi\n"
                "if [ \"$v\" != 42 ]; then echo \"check: value $v is not 42\"; exit 1; fi\n"
                "echo \"check: value $v ok\"\n",
}

CHECKS = """
check value_is_42
  build: toy
  run: sh check.sh
  timeout: 5

check always_fails
  run: echo 'no such tool'; exit 3
"""


def mutation(name, file, find, replace, check="value_is_42", expect=r"^check: value \S+ is not 42$"):
    return (f"\nmutation {name}\n  file: {file}\n  find: {find}\n  replace: {replace}\n"
            f"  check: {check}\n  expect: {expect}\n")


def make_tree(root):
    for rel, text in TREE.items():
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    subprocess.run(["git", "init", "-q", root], check=True)


def harness(root, mutations, *args):
    path = os.path.join(root, "mutations.txt")
    with open(path, "w") as f:
        f.write(CHECKS + mutations)
    env = {k: v for k, v in os.environ.items() if k != "AMSP_CCACHE_DIR"}
    p = subprocess.run([sys.executable, os.path.join(HERE, "mutate.py"), "--repo", root, "--work",
                        os.path.join(root, "build", "mutations"), path, *args],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=300)
    return p.returncode, p.stdout


def main():
    results = []

    def expect(what, ok, output):
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            print("     | " + "\n     | ".join(output.strip().splitlines()[-12:]))

    with tempfile.TemporaryDirectory(prefix="mutate_test.") as root:
        make_tree(root)

        rc, out = harness(root, mutation("caught", "value.txt", "42", "41")
                          + mutation("crashes", "value.txt", "42", "crash")
                          + mutation("passes", "notes.txt", "nothing", "no one")
                          + mutation("hangs", "value.txt", "42", "hang"))
        lines = out.splitlines()
        expect("caught: the check fails with the expected message",
               any(l.startswith("caught caught: check: value 41 is not 42") for l in lines), out)
        expect("a crash without the expected message is missed",
               any(l.startswith("MISSED crashes: the check failed (killed by SIGSEGV) without the expected message")
                   or l.startswith("MISSED crashes: the check failed (exit 139) without the expected message")
                   for l in lines), out)
        expect("a check that passes has missed",
               any(l.startswith("MISSED passes: the check passed") for l in lines), out)
        expect("a check that times out has missed",
               any(l.startswith("MISSED hangs: the check timed out") for l in lines), out)
        expect("any miss: exit 1, with the counts",
               rc == 1 and any(l.startswith("1 caught, 3 missed") for l in lines), out)
        expect("the tree is left as it was",
               open(os.path.join(root, "value.txt")).read() == "42\n"
               and open(os.path.join(root, "build", "mutations", "value.txt")).read() == "42\n", out)

        rc, out = harness(root, mutation("caught", "value.txt", "42", "41"))
        expect("every mutation caught: exit 0", rc == 0 and "1 caught, 0 missed" in out, out)

        rc, out = harness(root, mutation("caught", "value.txt", "42", "41")
                          + mutation("stale", "value.txt", "43", "41"))
        expect("a mutation that no longer applies fails the harness before any control runs",
               rc == 1 and "harness error: 1 of 2 mutations no longer apply" in out and "mutation 'stale'" in out
               and "occurs 0 times" in out and "control" not in out, out)

        rc, out = harness(root, mutation("caught", "value.txt", "42", "41")
                          + mutation("stale", "value.txt", "43", "41"), "--only", "caught")
        expect("so does one that was not selected (the suite's sample finds every stale one)",
               rc == 1 and "mutation 'stale'" in out and "no longer apply" in out and "control" not in out, out)

        rc, out = harness(root, mutation("twice", "check.sh", "42", "41"))
        expect("a text that occurs twice fails the harness",
               rc == 1 and "mutation 'twice'" in out and "occurs 2 times" in out, out)

        rc, out = harness(root, mutation("caught", "value.txt", "42", "41")
                          + mutation("bad-control", "value.txt", "42", "41", check="always_fails",
                                     expect="no such tool"))
        expect("a failing control fails the harness, naming the check",
               rc == 1 and "harness error: control 'always_fails' fails on the unmutated copy (exit 3" in out
               and "caught" not in out.replace("caught, ", ""), out)

        rc, out = harness(root, mutation("weak", "value.txt", "42", "41", expect="^check: value"))
        expect("an expected message that the passing control prints fails the harness",
               rc == 1 and "harness error: mutation 'weak': its expected message matches the passing control" in out,
               out)

        rc, out = harness(root, mutation("unbuildable", "value.txt", "42", "syntax-error"))
        expect("a mutated copy that does not build is a harness error, not a catch",
               rc == 1 and "ERROR  unbuildable: the mutated copy does not build" in out
               and "0 caught, 0 missed, 1 harness errors" in out, out)

    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
