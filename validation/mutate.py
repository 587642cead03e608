#!/usr/bin/env python3
"""Planted bugs with controls: shows that the suite's checks fail on the bugs they exist for.

Each mutation (validation/mutations/*.txt, format below) is an exact text replacement in
one file of a copy of the tree and the check that must catch it: a command, and a regular
expression that the check's output must match. The harness

  1. copies the tree (git's tracked and untracked, not ignored, files) to WORK and checks
     that every selected mutation's text occurs exactly once in its file: a mutation that
     no longer applies is an error of the harness, never a catch;
  2. builds the copy (cmake in WORK/build, through the suite's ccache, so only what a
     mutation changes is compiled) and runs every check that a selected mutation names
     on the unmutated copy: the controls. Each must pass, and no mutation's expected
     message may match its check's control output; otherwise the harness stops;
  3. for each mutation: applies it, builds the check's targets, runs the check, restores
     the file. A mutation counts as caught only when the check exits non-zero AND its
     output matches the mutation's expected message; a check that passes, crashes with
     another message or times out has missed it.

It prints one line per mutation and ends with "N caught, M missed". Exit status 0 when
every mutation is caught, 1 on any miss or harness error.

usage: validation/mutate.py [--work DIR] [--sample | --only REGEX ...] [--list] [FILE ...]
       validation/mutate.py --gtest-names BUILD [FILE ...]

--gtest-names checks, in an existing build and in seconds, what only a full run would
otherwise show: that every mutation whose expected message is a GoogleTest case failing
(`[  FAILED  ] Suite.Name`) names a case its check runs, under the check's --gtest_filter
(the suite's test mutations_gtest_names).

FILE defaults to validation/mutations/*.txt. --sample runs the mutations marked
`sample: yes` (the CTest entry mutations_sample); --only keeps the mutations whose name
matches REGEX (repeatable). Checks see, in their environment: SRC (the copy), BUILD
(its build directory), WORK (an empty directory of their own), CORPUS (AMSP_CORPUS, else
the suite's build/test-work/corpus.h5), MPIEXEC (MPIEXEC, else mpiexec). They run in
the copy's root under bash.

File format. Lines starting with '#' and blank lines are ignored. A record starts with
`check NAME` or `mutation NAME` at the start of a line; the indented `key: value` lines
after it are its fields. A value is the rest of the line, stripped; a value that needs
several lines, or exact leading spaces, is written as `key:` followed by lines of the form
`| text` (the text after "| " kept exactly; a lone "|" is an empty line), joined by
newlines. Fields:

  check NAME       run: the bash command; build: the targets it needs (space separated,
                   none when empty); timeout: seconds (default 600).
  mutation NAME    file: the path in the tree; find: the text to replace (exactly one
                   occurrence); replace: its replacement (may be empty); several
                   find/replace pairs make several edits of the file, in order;
                   check: a check's NAME; expect: the regular expression (Python,
                   multi-line mode) the check's output must match; about: one line
                   saying what the bug is; sample: yes to run it in the suite's sample.
"""
import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time

CHECK_KEYS = {"run", "build", "timeout"}
MUTATION_KEYS = {"file", "find", "replace", "check", "expect", "about", "sample"}
REPEATABLE = {"find", "replace"}  # several edits of one file, applied in order


class HarnessError(Exception):
    pass


def parse(path):
    """The records of one mutations file: (checks, mutations), dicts of {field: [values]}."""
    checks, mutations = {}, {}
    record, block = None, None  # block: the list whose last value '|' lines extend
    with open(path) as f:
        lines = f.read().split("\n")
    for number, line in enumerate(lines, 1):
        where = f"{path}:{number}"
        stripped = line.strip()
        if stripped.startswith("|") and block is not None:
            text = stripped[1:]
            if text and not text.startswith(" "):
                raise HarnessError(f"{where}: a block line is '| text' or a lone '|'")
            block[-1] = text[1:] if block[-1] is None else block[-1] + "\n" + text[1:]
            continue
        block = None
        if not stripped or stripped.startswith("#"):
            continue
        if not line[0].isspace():
            kind, _, name = stripped.partition(" ")
            name = name.strip()
            if kind not in ("check", "mutation") or not name:
                raise HarnessError(f"{where}: expected 'check NAME' or 'mutation NAME', got {stripped!r}")
            table = checks if kind == "check" else mutations
            if name in table:
                raise HarnessError(f"{where}: {kind} {name!r} defined twice")
            record = table[name] = {"_where": where, "_kind": kind}
            continue
        if record is None:
            raise HarnessError(f"{where}: a field before any record")
        k, colon, value = stripped.partition(":")
        k = k.strip()
        allowed = CHECK_KEYS if record["_kind"] == "check" else MUTATION_KEYS
        if not colon or k not in allowed:
            raise HarnessError(f"{where}: unknown field {k!r} (a {record['_kind']} has {', '.join(sorted(allowed))})")
        if k in record and k not in REPEATABLE:
            raise HarnessError(f"{where}: field {k!r} given twice")
        value = value.strip()
        # An empty value may open a block of '|' lines; it stays "" if none follows.
        record.setdefault(k, []).append(value if value else None)
        block = record[k] if not value else None
    for table in (checks, mutations):
        for rec in table.values():
            for k, v in rec.items():
                if isinstance(v, list):
                    rec[k] = ["" if x is None else x for x in v]
                    if k not in REPEATABLE:
                        rec[k] = rec[k][0]
    return checks, mutations


def load(files):
    checks, mutations = {}, {}
    for path in files:
        c, m = parse(path)
        for name, rec in c.items():
            if name in checks:
                raise HarnessError(f"{rec['_where']}: check {name!r} also defined at {checks[name]['_where']}")
            checks[name] = rec
        for name, rec in m.items():
            if name in mutations:
                raise HarnessError(f"{rec['_where']}: mutation {name!r} also defined at {mutations[name]['_where']}")
            mutations[name] = rec
    for name, c in checks.items():
        if not c.get("run"):
            raise HarnessError(f"{c['_where']}: check {name!r} has no run")
        c["targets"] = c.get("build", "").split()
        try:
            c["timeout_s"] = float(c.get("timeout", "600"))
        except ValueError:
            raise HarnessError(f"{c['_where']}: timeout {c['timeout']!r} is not a number")
    for name, m in mutations.items():
        for k in ("file", "find", "check", "expect"):
            if not m.get(k) or (k == "find" and not all(m[k])):
                raise HarnessError(f"{m['_where']}: mutation {name!r} has no {k}")
        if len(m.get("replace", [])) != len(m["find"]):
            raise HarnessError(f"{m['_where']}: mutation {name!r} has {len(m['find'])} find and "
                               f"{len(m.get('replace', []))} replace fields; each find needs its replace")
        m["edits"] = list(zip(m["find"], m["replace"]))
        if m["check"] not in checks:
            raise HarnessError(f"{m['_where']}: mutation {name!r} names check {m['check']!r}, which no file defines")
        if any(f == r for f, r in m["edits"]):
            raise HarnessError(f"{m['_where']}: mutation {name!r} replaces a text by itself")
        if m.get("sample", "no") not in ("yes", "no"):
            raise HarnessError(f"{m['_where']}: sample is 'yes' or 'no'")
        try:
            m["regex"] = re.compile(m["expect"], re.MULTILINE)
        except re.error as e:
            raise HarnessError(f"{m['_where']}: mutation {name!r}: bad expect regex: {e}")
    return checks, mutations


def run(cmd, cwd, env, timeout, log):
    """Runs a bash command in its own process group; (exit status or None on timeout, output)."""
    with open(log, "w") as out:
        p = subprocess.Popen(["bash", "-c", cmd], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = None
    with open(log, errors="replace") as f:
        return rc, f.read()


class Copy:
    """The tree copied to WORK, its build directory, and how checks run in it."""

    def __init__(self, repo, work, ccache):
        self.repo, self.work, self.ccache = repo, work, ccache
        self.build = os.path.join(work, "build")
        self.logs = os.path.join(work, "logs")

    def create(self):
        marker = os.path.join(self.work, ".amsp-mutations")
        if os.path.exists(self.work) and os.listdir(self.work) and not os.path.exists(marker):
            raise HarnessError(f"{self.work} is not empty and not a mutations directory")
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.logs)
        open(marker, "w").close()
        files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                               cwd=self.repo, check=True, stdout=subprocess.PIPE).stdout
        for rel in files.decode().split("\0"):
            src = os.path.join(self.repo, rel)
            if not rel or not os.path.isfile(src):  # deleted but still in the index
                continue
            dst = os.path.join(self.work, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst)

    def configure(self):
        cmd = ["cmake", "-S", self.work, "-B", self.build, "-DCMAKE_BUILD_TYPE=Release",
               "-DAMSP_TESTS=ON", "-DAMSP_BENCHMARKS=OFF"]
        if self.ccache:
            cmd.append(f"-DAMSP_CCACHE_DIR={self.ccache}")
        log = os.path.join(self.logs, "configure.log")
        with open(log, "w") as out:
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise HarnessError(f"configuring the copy failed (log: {log})")

    def make(self, targets, log):
        """Builds the targets; None on success, else the log's path."""
        if not targets:
            return None
        cmd = ["cmake", "--build", self.build, f"-j{os.cpu_count() or 1}", "--target", *targets]
        with open(log, "w") as out:
            ok = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode == 0
        return None if ok else log

    def check(self, check, label):
        """Runs a check; (exit status or None on timeout, output, log path)."""
        work = os.path.join(self.work, "runs", label)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        env = dict(os.environ, SRC=self.work, BUILD=self.build, WORK=work,
                   CORPUS=os.environ.get("AMSP_CORPUS", os.path.join(self.repo, "build", "test-work", "corpus.h5")),
                   MPIEXEC=os.environ.get("MPIEXEC", "mpiexec"))
        log = os.path.join(self.logs, f"{label}.log")
        rc, output = run(check["run"], self.work, env, check["timeout_s"], log)
        return rc, output, log


def apply(name, m, text):
    """The text with the mutation's edits made, each of which must occur exactly once."""
    for i, (find, replace) in enumerate(m["edits"]):
        count = text.count(find)
        if count != 1:
            which = "its text" if len(m["edits"]) == 1 else f"the text of its edit {i + 1}"
            raise HarnessError(f"mutation {name!r} ({m['_where']}): {which} occurs {count} times in "
                               f"{m['file']}, expected exactly once: the mutation no longer applies")
        text = text.replace(find, replace, 1)
    return text


def not_applying(repo, mutations):
    """Every mutation's edits checked against the tree, selected or not (a text check,
    milliseconds): so that the suite's sample also finds a mutation whose text the code
    has left behind."""
    stale = []
    for name, m in mutations.items():
        try:
            with open(os.path.join(repo, m["file"]), encoding="utf-8") as f:
                apply(name, m, f.read())
        except (OSError, HarnessError) as e:
            stale.append(str(e))
    return stale


GTEST_FAILED = re.compile(r"\\\[  FAILED  \\\] (\w+)\\\.(\w+)")  # in an expect: [  FAILED  ] Suite.Name
GTEST_RUN = re.compile(r"""^"?(\$BUILD/[^"\s]+)"?(?:.*--gtest_filter=['"]?([^'"\s]+))?""")


def gtest_cases(binary, gtest_filter, cache):
    """The Suite.Name cases `binary` runs under `gtest_filter` (--gtest_list_tests)."""
    key = (binary, gtest_filter)
    if key not in cache:
        p = subprocess.run([binary, "--gtest_list_tests", "--gtest_filter=" + gtest_filter],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise HarnessError(f"{binary} --gtest_list_tests failed (exit {p.returncode})")
        cases, suite = set(), ""
        for line in p.stdout.splitlines():
            if line and not line[0].isspace() and line.endswith("."):
                suite = line[:-1]
            elif line.startswith("  ") and suite:
                cases.add(f"{suite}.{line.split()[0]}")
        cache[key] = cases
    return cache[key]


def gtest_names(build, checks, mutations):
    """Mutations whose expected message is a GoogleTest case failing, [  FAILED  ] Suite.Name,
    that their check does not run (the case renamed, or the check's --gtest_filter leaving it
    out): such a mutation could never be caught. Needs the built binaries, not a copy."""
    cache, wrong = {}, []
    for n, m in mutations.items():
        named = GTEST_FAILED.search(m["expect"])
        run_line = GTEST_RUN.search(checks[m["check"]]["run"].strip())
        if not named or not run_line:
            continue
        binary, gtest_filter = run_line[1].replace("$BUILD", build), run_line[2] or "*"
        case = f"{named[1]}.{named[2]}"
        if not os.path.isfile(binary):
            raise HarnessError(f"mutation {n!r}: no {binary}: build it first")
        if not any(c == case or c.startswith(case) for c in gtest_cases(binary, gtest_filter, cache)):
            wrong.append(f"mutation {n!r} ({m['_where']}) expects {case} to fail, which check "
                         f"{m['check']!r} does not run (--gtest_filter={gtest_filter})")
    return wrong


def status(rc):
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


def safe(name):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:60]


def matched_line(regex, output):
    m = regex.search(output)
    if not m:
        return None
    start = output.rfind("\n", 0, m.start()) + 1
    end = output.find("\n", m.start())
    line = output[start:end if end >= 0 else len(output)].strip()
    # gtest's dump of a test's parameters is bytes, not words.
    line = re.sub(r", where GetParam\(\) = .*", "", line)
    return line[:400]


def tail(output, n=3):
    lines = [l for l in output.strip().split("\n") if l.strip()]
    return " | ".join(l.strip()[:160] for l in lines[-n:]) or "(no output)"


def controls(copy, checks, mutations, selected):
    """Checks that every mutation applies, builds the copy and runs the controls: the
    output of each involved check on the unmutated copy, which must pass."""
    for n in selected:
        m = mutations[n]
        path = os.path.join(copy.work, m["file"])
        if not os.path.isfile(path):
            raise HarnessError(f"mutation {n!r} ({m['_where']}): no file {m['file']}")
        apply(n, m, open(path).read())
    involved = sorted({mutations[n]["check"] for n in selected})
    targets = sorted({t for c in involved for t in checks[c]["targets"]})
    copy.configure()
    t0 = time.time()
    failed = copy.make(targets, os.path.join(copy.logs, "build-control.log"))
    if failed:
        raise HarnessError(f"the unmutated copy does not build (log: {failed})")
    print(f"mutate: built {' '.join(targets) or 'nothing'} in {time.time() - t0:.0f} s; "
          f"controls: {', '.join(involved)}", flush=True)
    output = {}
    for c in involved:
        t0 = time.time()
        rc, output[c], log = copy.check(checks[c], f"control-{safe(c)}")
        if rc != 0:
            why = "timed out" if rc is None else status(rc)
            raise HarnessError(f"control {c!r} fails on the unmutated copy ({why}; log: {log}): {tail(output[c])}")
        print(f"control ok   {c} ({time.time() - t0:.0f} s)", flush=True)
    for n in selected:
        m = mutations[n]
        line = matched_line(m["regex"], output[m["check"]])
        if line is not None:
            raise HarnessError(f"mutation {n!r}: its expected message matches the passing control "
                               f"{m['check']!r} ({line!r}): it cannot tell a catch")


def plant(copy, name, m, check):
    """Plants one mutation, runs its check, puts the file back: 'caught', 'missed' or 'error'."""
    path = os.path.join(copy.work, m["file"])
    original = open(path).read()
    t0 = time.time()
    try:
        with open(path, "w") as f:
            f.write(apply(name, m, original))
        failed = copy.make(check["targets"], os.path.join(copy.logs, f"build-{safe(name)}.log"))
        t_build = time.time() - t0
        if failed:
            print(f"ERROR  {name}: the mutated copy does not build (log: {failed})", flush=True)
            return "error"
        rc, output, log = copy.check(check, safe(name))
    finally:
        with open(path, "w") as f:
            f.write(original)
    took = f"[build {t_build:.0f} s, {m['check']} {time.time() - t0 - t_build:.0f} s]"
    line = matched_line(m["regex"], output)
    if rc not in (0, None) and line is not None:
        print(f"caught {name}: {line} {took}", flush=True)
        return "caught"
    why = ("the check passed" if rc == 0 else "the check timed out" if rc is None
           else f"the check failed ({status(rc)}) without the expected message")
    print(f"MISSED {name}: {why} (log: {log}): {tail(output)} {took}", flush=True)
    return "missed"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="mutation files (default: validation/mutations/*.txt)")
    ap.add_argument("--repo", default=os.path.dirname(here), help="the tree to copy (default: this one)")
    ap.add_argument("--work", help="the copy's directory (default: REPO/build/mutations)")
    ap.add_argument("--sample", action="store_true", help="only the mutations marked 'sample: yes'")
    ap.add_argument("--only", action="append", default=[], metavar="REGEX",
                    help="only the mutations whose name matches REGEX (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the selected mutations and stop")
    ap.add_argument("--gtest-names", metavar="BUILD",
                    help="only check, in the build BUILD, that every mutation expecting a GoogleTest "
                         "case to fail names one its check runs, and stop")
    args = ap.parse_args()
    repo = os.path.abspath(args.repo)
    files = args.files or sorted(glob.glob(os.path.join(here, "mutations", "*.txt")))
    work = os.path.abspath(args.work or os.path.join(repo, "build", "mutations"))
    ccache = os.environ.get("AMSP_CCACHE_DIR") or (
        os.path.join(repo, "build", "ccache") if os.path.isdir(os.path.join(repo, "build", "ccache")) else "")
    t_start = time.time()
    results = {}
    try:
        checks, mutations = load(files)
        selected = [n for n, m in mutations.items()
                    if (not args.sample or m.get("sample") == "yes")
                    and (not args.only or any(re.search(o, n) for o in args.only))]
        if not selected:
            raise HarnessError("no mutation selected")
        stale = not_applying(repo, mutations)
        if stale:
            raise HarnessError(f"{len(stale)} of {len(mutations)} mutations no longer apply to {repo}: "
                               + "; ".join(stale))
        if args.gtest_names:
            wrong = gtest_names(os.path.abspath(args.gtest_names), checks, mutations)
            for w in wrong:
                print(w)
            print(f"{len(wrong)} of {len(mutations)} mutations name a GoogleTest case their check does not run")
            return 1 if wrong else 0
        if args.list:
            for n in selected:
                m = mutations[n]
                print(f"{n:36s} {m['check']:28s} {m['file']}" + ("  [sample]" if m.get("sample") == "yes" else ""))
            return 0
        copy = Copy(repo, work, ccache)
        print(f"mutate: {len(selected)} mutations; copying {repo} to {work}", flush=True)
        copy.create()
        controls(copy, checks, mutations, selected)
        for n in selected:
            results[n] = plant(copy, n, mutations[n], checks[mutations[n]["check"]])
    except HarnessError as e:
        print(f"mutate: harness error: {e}", flush=True)
        return 1
    count = {r: [n for n in results if results[n] == r] for r in ("caught", "missed", "error")}
    summary = f"{len(count['caught'])} caught, {len(count['missed'])} missed"
    if count["error"]:
        summary += f", {len(count['error'])} harness errors ({', '.join(count['error'])})"
    print(f"{summary} ({time.time() - t_start:.0f} s)")
    return 0 if len(count["caught"]) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
