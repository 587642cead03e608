#!/usr/bin/env python3
"""Data mixtures through the real `amsp train` and `amsp eval` (doc/data.md, "Mixtures").

Three byte-level datasets are prepared from generated text; every run is the tiny preset,
--seq-len 32, 6 rows per step, --threads 1, --checkpoint-mode sync.

  1  one dataset: the windows `--data-order` records are the ones doc/data.md's formula
     gives (computed here, independently of amsp), and `--data x.h5:5` trains the same
     bits as `--data x.h5`, with no per-source fields in the metrics.
  2  a mixture on 2 ranks: every row's source and window start are the formula's (the
     source drawn on its own stream from (seed, step, row)); source_tokens count them;
     val_loss is the sources' val_loss_sources weighted by the mixture.
  3  resume on the same 2 ranks (stopped by SIGUSR1 raised during step 7, exit 75,
     --resume auto): every metric, per-source ones included, and the final parameters
     are the same bits as the uninterrupted run's.
  4  resume of the same checkpoint on 3 ranks (batch 2) and on 1 rank (batch 3, 2
     micro-batches): the same windows from the same sources (the --data-order files are
     byte-identical) and the same source_tokens; losses and validation losses within
     1e-5 relative (the sums of gradients run in another order on another rank count,
     as resume_test.py's resharding check allows).
  5  a changed mixture on resume: other weights are listed ("resume: changed: --data
     ...") and the run goes on; a source with other tokens is refused (exit 2, one line
     naming --force-resume), and taken with --force-resume, its tokens counted from 0.
  6  bad --data specs: exit 2, one stderr line each, naming the entry.
  7  `amsp eval --data` with the mixture: one line per source and the weighted mean.

usage: mixture_test.py --amsp PATH --work DIR [--mpiexec PATH]
Prints one line per check and ends with "N passed, M failed"; exit 1 on any failure.
"""

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "engine"))
import equivalence_test as eq  # noqa: E402  (clean_env)

SEQ, STEPS, STOP = 32, 10, 7
LOSS_TOL = 1e-5
RUN_TIMEOUT = 240
MASK = (1 << 64) - 1
TRAIN_WINDOW_STREAM = 0x747261696E77696E  # "trainwin", src/data/sampler.cpp
SOURCE_STREAM = 0x6D6978736F757263        # "mixsourc", src/data/mixture.cpp


class Failure(Exception):
    pass


# --- doc/data.md's formulas, written out here -------------------------------------
def mix64(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def random_u64(seed, stream, index):
    return mix64(mix64(mix64(seed) ^ stream) ^ index)


def window_start(seed, step, row, train_tokens):
    choices = train_tokens - SEQ
    return (random_u64(seed, TRAIN_WINDOW_STREAM, (step << 32) | row) * choices) >> 64


def source_of(seed, step, row, weights):
    u = (random_u64(seed, SOURCE_STREAM, (step << 32) | row) >> 11) * 2.0 ** -53
    total, cumulative = sum(weights), 0.0
    for i, w in enumerate(weights):
        cumulative += w
        if u < (cumulative / total if i + 1 < len(weights) else 1.0):
            return i
    raise AssertionError("unreachable")


# --- running amsp -------------------------------------------------------------------
class Runner:
    def __init__(self, args):
        self.amsp, self.mpiexec, self.work = args.amsp, args.mpiexec, args.work

    def run(self, args, ranks=1, env=None, expect=(0,)):
        cmd = ([self.mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [self.amsp] + args
        rc, out, err, _ = eq.run(cmd, eq.clean_env(env), timeout=RUN_TIMEOUT)
        if rc not in expect:
            raise Failure(f"exit {rc} (expected {expect}) from {' '.join(cmd)}:\n{err[-2000:]}")
        return rc, out, err

    def train(self, name, data, ranks, batch, accum=1, extra=(), env=None, expect=(0,)):
        args = ["train", "--model", "tiny", "--data", data, "--steps", str(STEPS), "--seq-len", str(SEQ),
                "--batch-size", str(batch), "--grad-accum", str(accum), "--eval-every", "5",
                "--eval-windows", "4", "--threads", "1", "--peak-tflops", "1", "--checkpoint-mode", "sync",
                "--shard", "ddp", "--metrics", self.path(name + ".jsonl"),
                "--data-order", self.path(name + ".order")] + list(extra)
        return self.run(args, ranks, env, expect)

    def path(self, name):
        return os.path.join(self.work, name)


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def prepare(runner, name, text):
    """A byte-level dataset; returns (path, train tokens)."""
    src = runner.path(name + ".txt")
    with open(src, "w") as f:
        f.write(text)
    out = runner.path(name + ".h5")
    _, stdout, _ = runner.run(["data", "prepare", "--input", src, "--output", out])
    m = re.search(r"-> (\d+) train", stdout)
    if not m:
        raise Failure(f"prepare said: {stdout}")
    return out, int(m.group(1))


def same(a, b, what):
    if a != b:
        raise Failure(f"{what}: {a!r} != {b!r}")


def close(a, b, what, tol=LOSS_TOL):
    if a is None or b is None or abs(a - b) > tol * max(abs(b), 1e-30):
        raise Failure(f"{what}: {a!r} vs {b!r} (relative tolerance {tol})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--amsp", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    r = Runner(args)

    rng = random.Random(1)
    texts = {
        "fox": "The quick brown fox jumps over the lazy dog. " * 3000,
        "greek": " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega"]) for _ in range(30000)),
        "digits": " ".join(str(rng.randrange(10 ** 6)) for _ in range(20000)),
    }
    data = {name: prepare(r, name, text) for name, text in texts.items()}
    names = ["fox", "greek", "digits"]
    weights = [0.5, 0.3, 0.2]
    mixture = ",".join(f"{data[n][0]}:{w}" for n, w in zip(names, weights))
    rows = 6
    results = []

    def check(name, fn):
        try:
            fn()
            results.append(True)
            print(f"ok   {name}", flush=True)
        except Failure as e:
            results.append(False)
            print(f"FAIL {name}: {e}", flush=True)

    def one_dataset():
        fox, n = data["fox"]
        r.train("one", fox, 1, rows)
        for line in records(r.path("one.order")):
            same(line["starts"], [window_start(1337, line["step"], row, n) for row in range(rows)],
                 f"step {line['step']} starts")
            same("sources" in line, False, "a sources field for one dataset")
        r.train("one_weighted", f"{fox}:5", 1, rows)
        same(read(r.path("one_weighted.order")), read(r.path("one.order")), "--data-order with a weight")
        a, b = records(r.path("one.jsonl")), records(r.path("one_weighted.jsonl"))
        same([(x.get("loss"), x.get("val_loss")) for x in a], [(x.get("loss"), x.get("val_loss")) for x in b],
             "losses with a weight")
        same(any("source_tokens" in x or "val_loss_sources" in x for x in a), False, "per-source fields")

    def sources_by_formula():
        r.train("full", mixture, 2, rows // 2, extra=["--final-params", r.path("full.bin")])
        counts = [0, 0, 0]
        full = records(r.path("full.jsonl"))
        for line, rec in zip(records(r.path("full.order")), full[1:]):
            step = line["step"]
            src = [source_of(1337, step, row, weights) for row in range(rows)]
            same(line["sources"], src, f"step {step} sources")
            same(line["starts"], [window_start(1337, step, row, data[names[s]][1]) for row, s in enumerate(src)],
                 f"step {step} starts")
            for s in src:
                counts[s] += SEQ
            same(rec["source_tokens"], {data[n][0]: c for n, c in zip(names, counts)}, f"step {step} source_tokens")
        same(min(counts) > 0, True, "every source drawn")
        for rec in full:
            if "val_loss" in rec:
                per = rec["val_loss_sources"]
                close(rec["val_loss"], sum(w * per[data[n][0]] for n, w in zip(names, weights)),
                      f"step {rec['step']} val_loss as the weighted mean", 1e-12)

    def stopped_run():
        r.train("part", mixture, 2, rows // 2, extra=["--checkpoint-dir", r.path("ck")],
                env={"AMSP_FAULT": f"train.step@{STOP},USR1"}, expect=(75,))
        shutil.copytree(r.path("ck"), r.path("ck_saved"))
        for name in ("part.jsonl", "part.order"):
            shutil.copy(r.path(name), r.path("saved_" + name))

    def resume_same_ranks():
        stopped_run()
        _, out, _ = r.train("part", mixture, 2, rows // 2, extra=[
            "--checkpoint-dir", r.path("ck"), "--resume", "auto", "--final-params", r.path("part.bin")])
        same("resume: changed" in out, False, "a change listed")
        a, b = records(r.path("full.jsonl")), records(r.path("part.jsonl"))
        same(len(b), len(a), "records")
        for x, y in zip(a, b):
            for key in ("loss", "grad_norm", "lr", "tokens", "val_loss", "val_loss_sources", "source_tokens"):
                same(y.get(key), x.get(key), f"step {x['step']} {key}")
        same(read(r.path("part.order")), read(r.path("full.order")), "--data-order")
        same(read(r.path("part.bin"), "rb") == read(r.path("full.bin"), "rb"), True, "final parameters")

    def resume_other_ranks():
        full = records(r.path("full.jsonl"))
        for name, ranks, batch, accum in (("three", 3, 2, 1), ("single", 1, 3, 2)):
            ck = r.path("ck_" + name)
            shutil.copytree(r.path("ck_saved"), ck)
            for suffix in ("jsonl", "order"):
                shutil.copy(r.path("saved_part." + suffix), r.path(f"{name}.{suffix}"))
            r.train(name, mixture, ranks, batch, accum, extra=["--checkpoint-dir", ck, "--resume", "auto"])
            same(read(r.path(name + ".order")), read(r.path("full.order")), f"{name}: --data-order")
            got = records(r.path(name + ".jsonl"))
            same(len(got), len(full), f"{name}: records")
            for x, y in zip(full[STOP + 1:], got[STOP + 1:]):
                same(y["source_tokens"], x["source_tokens"], f"{name}: step {x['step']} source_tokens")
                close(y["loss"], x["loss"], f"{name}: step {x['step']} loss")
                if "val_loss" in x:
                    close(y["val_loss"], x["val_loss"], f"{name}: step {x['step']} val_loss")
                    for path, loss in x["val_loss_sources"].items():
                        close(y["val_loss_sources"][path], loss, f"{name}: step {x['step']} {path}")

    def changed_mixture():
        reweighted = ",".join(f"{data[n][0]}:{w}" for n, w in zip(names, [0.2, 0.3, 0.5]))
        ck = r.path("ck_reweighted")
        shutil.copytree(r.path("ck_saved"), ck)
        _, out, _ = r.train("reweighted", reweighted, 2, rows // 2, extra=["--checkpoint-dir", ck, "--resume", "auto"])
        if f"resume: changed: --data {reweighted} (was {mixture}): the mixture's weights or order changed" not in out:
            raise Failure(f"no change listed for other weights:\n{out[-1500:]}")
        other, _ = prepare(r, "other", "Something else entirely, " * 4000)
        replaced = f"{data['fox'][0]}:0.5,{data['greek'][0]}:0.3,{other}:0.2"
        ck = r.path("ck_replaced")
        shutil.copytree(r.path("ck_saved"), ck)
        _, _, err = r.train("replaced", replaced, 2, rows // 2, extra=["--checkpoint-dir", ck, "--resume", "auto"],
                            expect=(2,))
        lines = err.strip().splitlines()
        if len(lines) != 1 or f"--data {other} holds other tokens" not in lines[0] or "--force-resume" not in lines[0]:
            raise Failure(f"refusal of another source: {err!r}")
        shutil.copy(r.path("saved_part.jsonl"), r.path("replaced.jsonl"))
        _, out, _ = r.train("replaced", replaced, 2, rows // 2,
                            extra=["--checkpoint-dir", ck, "--resume", "auto", "--force-resume"])
        if f"resume: forced (--force-resume): --data {other} holds other tokens" not in out:
            raise Failure(f"forced resume not said:\n{out[-1500:]}")
        before = records(r.path("saved_part.jsonl"))[-1]["source_tokens"]
        after = records(r.path("replaced.jsonl"))[STOP + 1]["source_tokens"]
        same(after[other], SEQ * sum(1 for row in range(rows) if source_of(1337, STOP + 1, row, [0.5, 0.3, 0.2]) == 2),
             "the new source's tokens after one step")
        same(after[data["fox"][0]] >= before[data["fox"][0]], True, "fox's tokens carried over")

    def bad_specs():
        fox, greek = data["fox"][0], data["greek"][0]
        cases = [
            (f"{fox}:0.5,{greek}:0", rf"^amsp: error: --data {re.escape(greek)}:0: weight 0 of .*expected a positive finite number$"),
            (f"{fox}:0.5,{greek}:lots", r"weight \"lots\" is not a number; expected PATH or PATH:WEIGHT"),
            (f"{fox}:-2,{greek}", r"weight -2 of .*expected a positive finite number"),
            (f"{fox},{fox}", r"is named twice \(entries 1 and 2\); expected each dataset once"),
            (f"{fox},{r.path('nosuch.h5')}:0.5", r"--data .*nosuch\.h5: no such file$"),
        ]
        for spec, pattern in cases:
            _, _, err = r.run(["train", "--data", spec, "--steps", "1"], expect=(2,))
            lines = err.strip().splitlines()
            if len(lines) != 1 or not re.search(pattern, lines[0]):
                raise Failure(f"--data {spec}: {err!r} does not match /{pattern}/")

    def eval_per_source():
        ck = os.path.join(r.path("ck_saved"), f"step-{STOP:08d}.h5")
        _, out, _ = r.run(["eval", "--checkpoint", ck, "--data", mixture, "--seq-len", str(SEQ),
                           "--windows", "4", "--threads", "1"], ranks=2)
        losses = {}
        for n in names:
            m = re.search(rf"on {re.escape(data[n][0])}, validation split: loss ([0-9.]+) over 4 windows", out)
            if not m:
                raise Failure(f"no line for {n}:\n{out}")
            losses[n] = float(m.group(1))
        m = re.search(r"^mixture .*, validation split: loss ([0-9.]+) \(the sources' losses weighted", out, re.M)
        if not m:
            raise Failure(f"no mixture line:\n{out}")
        close(float(m.group(1)), sum(w * losses[n] for n, w in zip(names, weights)), "weighted mean", 1e-5)

    check("one dataset: the formula's windows, a weight changes nothing", one_dataset)
    check("a mixture on 2 ranks: sources, windows and source_tokens by the formula", sources_by_formula)
    check("resume on the same 2 ranks: every metric and the parameters bit for bit", resume_same_ranks)
    check("resume on 3 ranks and on 1 rank: the same data, losses within 1e-5", resume_other_ranks)
    check("a changed mixture on resume: listed, or refused unless forced", changed_mixture)
    check("bad --data specs: exit 2, one line", bad_specs)
    check("amsp eval on a mixture: per source and weighted", eval_per_source)
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    sys.exit(0 if passed == len(results) else 1)


if __name__ == "__main__":
    main()
