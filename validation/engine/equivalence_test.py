#!/usr/bin/env python3
"""N ranks with any shard plan train exactly what one rank does with the same global batch.

For each case (world layout, plan, micro-batches M, per-rank batch B) `amsp train` runs
20 steps of the tiny preset on N ranks, and the reference runs on one rank with the
same global batch cut into the same micro-batches: batch B and N*M micro-batches (one
reference per (B, N*M), computed once). Micro-batch k of the reference is micro-batch
k // N of rank k % N, so every forward and backward is the same arithmetic on the same
data; the two sides differ only in the order in which the N*M micro-batch gradients
are added (doc/engine-tests.md derives the tolerances from that). Compared:

  - every step's loss, and the validation loss at the start and the end: relative
    difference <= 1e-5; the gradient norm: <= 1e-5 at step 1, <= 1e-4 later;
  - the parameters after the last step (--final-params, raw float32 in layout order),
    per tensor: max |a - b| / max |b| <= 1e-3 (the scale of the reference tensor, as
    validation/hf_compare.py does) and |a - b| / |b| (L2) <= 1e-5. The worst tensor is
    reported.

In mpi mode every case also checks the one issue order (validation/engine/issue_order.py):
each rank logs the collectives it issues, its communication thread slowed by its own random
time, and every rank's log must be the same and be `amsp plan --schedule`'s step order.

Also: a plan that does not fit the world (mics:3) is refused before any work, exit code
2 and the reason on stderr; and --shard auto runs, names the plan it chose on its first
output line, and gives the reference losses too.

Modes:
  mpi    mpiexec -n N on this machine (one node with N ranks)
  slurm  srun --mpi=pmi2 on a local Slurm cluster of 4 virtual nodes x 2 CPUs that the
         script starts (validation/slurm/local_cluster.py: start.sh on ports found free)
         and always stops again (finally, signal handlers, an internal deadline below the
         CTest timeout). Exit code 77 (CTest SKIP_RETURN_CODE) without root, Slurm or munge.

usage: equivalence_test.py MODE --amsp PATH --data CORPUS.h5 --work DIR
                           [--mpiexec PATH] [--cluster-scripts DIR] [--only TEXT]
Prints one line per case and ends with "N passed, M failed"; exit 1 on any failure.
See doc/engine-tests.md.
"""

import argparse
import json
import math
import re
import os
import shutil
import signal
import subprocess
import sys
import time
from array import array

SKIP = 77
# Tolerances, derived in doc/engine-tests.md ("Why these tolerances"). Both sides compute
# every micro-batch bit for bit alike; they differ only in the order of an R-term fp32
# sum (R = ranks x micro-batches <= 16), i.e. by at most 2(R-1)u of the summands' sum of
# magnitudes per gradient element, u = 2^-24. Losses and the step-1 gradient norm see that
# directly (<= 2e-6); later norms and the parameters see it after AdamW, whose eps
# amplifies the last-bit differences of near-zero gradient elements, and 20 steps of
# feedback. A real bug (a shard's update skipped or wrong, a reduction missed) moves a
# shard by a whole update, lr ~ 1e-4..1e-3, i.e. >= 1e-3 of a tensor in L2.
LOSS_TOL = 1e-5
NORM_TOL = 1e-4
PARAM_MAX_TOL = 1e-3
PARAM_L2_TOL = 1e-5
# bf16 (doc/engine-tests.md, "bf16"): loss, step-1 norm, later norms, params max, params L2.
# u = 2^-8 is bf16's unit roundoff (8 significant bits). Each side rounds a gradient element
# at most twice more than the other (the unit gradient, the reduction's result): the step-1
# norm moves by at most 2u = 2^-7. Parameters then differ by a rounding here and there, and
# a loss, to first order, by at most what a relative change u of every parameter would do:
# 2^-8. AdamW turns a relative gradient difference of ~2u into an update difference of
# ~2u lr; 20 steps of independent roundings give sqrt(20) 2u lr, about 3e-3 of a tensor's
# scale at these learning rates; 1e-2 bounds aligned roundings. Later norms and single
# elements react to one-rounding parameter differences with no bound we can derive: 0.25
# only catches garbage.
BF16_TOLS = (2.0 ** -8, 2.0 ** -7, 0.25, 0.25, 1e-2)
FIRST_NORM_TOL = LOSS_TOL
STEPS, SEQ = 20, 32
DEADLINE = 540        # seconds for the whole script, below the CTest TIMEOUT of 600
RUN_TIMEOUT = 150     # seconds for one amsp run
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "slurm"))
import local_cluster as lc  # noqa: E402
import issue_order  # noqa: E402

# (ranks per node, nodes, plan, M, B). Plans name their factors as
# "ranks per node x nodes"; on mpiexec every rank is on one node.
MPI_CASES = (
    # 4 ranks, one micro-batch: every named plan and two mixed ones
    [(4, 1, p, 1, 1) for p in ("ddp", "zero1", "zero2", "zero3", "fsdp", "mics:2", "mics:4",
                               "p=2x1,g=2x1,os=4x1", "p=1,g=2x1,os=4x1")]
    # 4 ranks, three micro-batches, and a per-rank batch of 2
    + [(4, 1, p, 3, 1) for p in ("zero2", "zero3", "mics:2", "p=1,g=2x1,os=4x1")]
    + [(4, 1, p, 2, 2) for p in ("zero1", "p=2x1,g=2x1,os=4x1")]
    # 8 ranks, two micro-batches: every named plan and two mixed ones
    + [(8, 1, p, 2, 1) for p in ("ddp", "zero1", "zero2", "zero3", "mics:2", "mics:4",
                                 "p=2x1,g=2x1,os=8x1", "p=1,g=2x1,os=4x1")]
    # 8 ranks, one micro-batch
    + [(8, 1, p, 1, 1) for p in ("zero1", "zero3", "mics:4", "p=2x1,g=4x1,os=8x1")]
)
# bf16 on 4 ranks: every named plan and two mixed ones, one and two micro-batches.
BF16_CASES = (
    [(4, 1, p, 1, 1) for p in ("ddp", "zero1", "zero2", "zero3", "fsdp", "mics:2", "mics:4",
                               "p=2x1,g=2x1,os=4x1", "p=1,g=2x1,os=4x1")]
    + [(4, 1, p, 2, 1) for p in ("zero1", "zero3", "p=2x1,g=2x1,os=4x1")]
)
# Under srun, only what the node layout changes: plans whose groups the nodes cut (factors
# "ranks per node x nodes"). A plan whose every group is the world or one rank (ddp,
# zero1-3; mics:4 on 2 nodes x 2) has the same groups on any nodes: it would repeat an
# mpiexec case. The cases kept also send every kind of collective between nodes.
SLURM_CASES = (
    # 4 nodes x 2 ranks, two micro-batches: mics:4 = 2x2, mixed plans across nodes
    [(2, 4, p, 2, 1) for p in ("mics:2", "mics:4", "p=2x1,g=2x2,os=2x4", "p=1,g=2x1,os=2x2")]
    + [(2, 4, p, 1, 1) for p in ("mics:4", "p=2x1,g=2x2,os=2x4")]
    # 2 nodes x 2 ranks
    + [(2, 2, p, 1, 1) for p in ("mics:2", "p=2x1,g=2x1,os=2x2", "p=1,g=2x1,os=2x2")]
    + [(2, 2, p, 3, 1) for p in ("mics:2", "p=1,g=2x1,os=2x2")]
    # 4 nodes x 1 rank: every group crosses nodes
    + [(1, 4, "mics:2", 2, 1)]
)


class Failure(Exception):
    pass


def clean_env(extra=None):
    """This environment without Slurm or PMI variables (the test may run inside a job)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "PMI_", "HYDRA_"))}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if extra:
        env.update(extra)
    return env


def run(cmd, env, timeout=RUN_TIMEOUT):
    """Runs cmd in its own process group; kills the whole group on timeout or on any
    exception (a signal handler raising). Returns (returncode, stdout, stderr, seconds)."""
    t0 = time.time()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException:
        for sig in (signal.SIGTERM, signal.SIGKILL):  # srun forwards SIGTERM to its tasks
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                pass
        p.communicate()
        raise
    return p.returncode, out, err, time.time() - t0


# --- the parameter layout of a model (src/model/layout.h) ----------------------
def tensor_layout(config_path):
    """[(name, numel)] in the order of --final-params: embed, layers.0.., head."""
    c = json.load(open(config_path))
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = h // c["num_attention_heads"] * c.get("num_key_value_heads", c["num_attention_heads"])
    out = [("model.embed_tokens.weight", v * h)]
    for layer in range(c["num_hidden_layers"]):
        pre = f"model.layers.{layer}."
        out += [(pre + "input_layernorm.weight", h), (pre + "self_attn.q_proj.weight", h * h),
                (pre + "self_attn.k_proj.weight", kv * h), (pre + "self_attn.v_proj.weight", kv * h),
                (pre + "self_attn.o_proj.weight", h * h), (pre + "post_attention_layernorm.weight", h),
                (pre + "mlp.gate_proj.weight", i * h), (pre + "mlp.up_proj.weight", i * h),
                (pre + "mlp.down_proj.weight", h * i)]
    out += [("model.norm.weight", h), ("lm_head.weight", v * h)]
    return out


def read_params(path):
    a = array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


def compare_params(got, ref, layout):
    """Per tensor, max |got - ref| / max |ref|: (worst value, its tensor, the worst
    relative L2 difference |got - ref| / |ref| over the tensors). inf on a size mismatch."""
    total = sum(n for _, n in layout)
    if len(got) != total or len(ref) != total:
        return float("inf"), f"size {len(got)} floats, reference {len(ref)}, layout {total}", float("inf")
    worst, where, worst_l2, off = -1.0, "", 0.0, 0
    for name, n in layout:
        a, b = got[off:off + n], ref[off:off + n]
        off += n
        scale = max(max(map(abs, b)), 1e-30)
        err = max(abs(x - y) for x, y in zip(a, b)) / scale
        l2 = math.sqrt(math.fsum((x - y) ** 2 for x, y in zip(a, b)) / max(math.fsum(y * y for y in b), 1e-60))
        if err != err or l2 != l2:  # NaN
            err = l2 = float("inf")
        if err > worst:
            worst, where = err, name
        worst_l2 = max(worst_l2, l2)
    return worst, where, worst_l2


def rel(a, b):
    if a is None or b is None:
        return float("inf")
    return abs(a - b) / max(abs(b), 1e-30)


def compare_metrics(got, ref):
    """Worst relative differences as ((value, where) of the losses and validation losses,
    (value, where) of the gradient norms, the gradient norm of step 1)."""
    if [r["step"] for r in got] != [r["step"] for r in ref]:
        bad = (float("inf"), f"steps {[r['step'] for r in got][-3:]} vs reference {[r['step'] for r in ref][-3:]}")
        return bad, bad, float("inf")
    worst = {"loss": (-1.0, ""), "grad_norm": (-1.0, "")}
    first_norm = float("inf")
    for g, r in zip(got, ref):
        for key in ("loss", "val_loss", "grad_norm"):
            if key in r or key in g:
                err = rel(g.get(key), r.get(key))
                if err != err:  # NaN
                    err = float("inf")
                kind = "grad_norm" if key == "grad_norm" else "loss"
                if err > worst[kind][0]:
                    worst[kind] = (err, f"{key} step {r['step']}")
                if key == "grad_norm" and r["step"] == 1:
                    first_norm = err
    return worst["loss"], worst["grad_norm"], first_norm


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class Runner:
    """Starts amsp train on N ranks (mpiexec or srun) or one rank, in a work directory."""

    def __init__(self, args, slurm_env=None):
        self.args = args
        self.slurm_env = slurm_env
        self.refs = {}
        # The issue log needs mpiexec's PMI_RANK and the schedule of one node.
        self.check_order = slurm_env is None
        self.layout = tensor_layout(self.args.model)

    def train_args(self, batch, accum, shard, tag, steps=STEPS):
        return [self.args.amsp, "train", "--model", self.args.model, "--data", self.args.data,
                "--precision", self.args.precision,
                "--steps", str(steps), "--seq-len", str(SEQ), "--batch-size", str(batch),
                "--grad-accum", str(accum), "--shard", shard, "--eval-every", "0",
                "--eval-windows", "8", "--peak-tflops", "1", "--threads", "1",
                "--comm-timeout", "60",
                "--metrics", os.path.join(self.args.work, f"{tag}.jsonl"),
                "--final-params", os.path.join(self.args.work, f"{tag}.bin"), *self.args.engine_arg]

    def launcher(self, per_node, nodes):
        if self.slurm_env is None:
            assert nodes == 1
            return [self.args.mpiexec, "-n", str(per_node)], clean_env()
        return (["srun", "--mpi=pmi2", "--time=4", "-N", str(nodes), f"--ntasks-per-node={per_node}"],
                self.slurm_env)

    def launch(self, per_node, nodes, batch, accum, shard, tag, steps=STEPS, order=None):
        """order: (env additions, command prefix) of issue_order.env_and_wrapper, or None."""
        for ext in (".jsonl", ".bin"):
            path = os.path.join(self.args.work, tag + ext)
            if os.path.exists(path):
                os.remove(path)
        pre, env = self.launcher(per_node, nodes)
        if order:
            env = dict(env, **order[0])
            pre = pre + order[1]
        cmd = pre + self.train_args(batch, accum, shard, tag, steps)
        return cmd, run(cmd, env)

    def issue_order_setup(self, per_node, plan, accum, batch, tag):
        """(schedule's step, log folder, (env, prefix)) for a case whose issue order is checked."""
        expected = issue_order.schedule_issues(lambda c: run(c, clean_env()), self.args.amsp, per_node,
                                               plan, accum, batch, SEQ, self.args.precision, self.args.model,
                                               self.args.engine_arg)
        logdir = os.path.join(self.args.work, tag + "-issues")
        shutil.rmtree(logdir, ignore_errors=True)
        os.makedirs(logdir)
        seed = sum(map(ord, tag))
        return expected, logdir, issue_order.env_and_wrapper(logdir, per_node, seed)

    def reference(self, batch, micro_batches):
        """One rank, the same micro-batches as the N ranks together: batch B, N*M of them."""
        key = (batch, micro_batches)
        if key not in self.refs:
            tag = f"ref-b{batch}-m{micro_batches}"
            cmd = self.train_args(batch, micro_batches, "ddp", tag)
            rc, out, err, secs = run(cmd, clean_env())
            if rc != 0:
                raise Failure(f"reference run failed ({rc}): {' '.join(cmd)}\n{err.strip()[-2000:]}")
            self.refs[key] = (read_metrics(os.path.join(self.args.work, f"{tag}.jsonl")),
                              read_params(os.path.join(self.args.work, f"{tag}.bin")))
            print(f"     reference: 1 rank, batch {batch}, M={micro_batches}: {secs:.1f} s", flush=True)
        return self.refs[key]

    def case(self, per_node, nodes, plan, accum, batch, check_order=True):
        world = per_node * nodes
        label = (f"{world} ranks ({per_node}x{nodes}) {plan:20s} M={accum} B={batch}")
        ref_metrics, ref_params = self.reference(batch, world * accum)
        tag = f"w{per_node}x{nodes}-{plan.replace(':', '').replace(',', '_').replace('=', '')}-m{accum}-b{batch}"
        check_order = check_order and self.check_order
        if check_order:
            try:
                expected, logdir, order = self.issue_order_setup(per_node, plan, accum, batch, tag)
            except ValueError as e:
                return False, f"{label}  {e}", [], "", ""
        cmd, (rc, out, err, secs) = self.launch(per_node, nodes, batch, accum, plan, tag,
                                                order=order if check_order else None)
        first = out.splitlines()[0] if out else ""
        if rc != 0:
            return False, f"{label}  exited with {rc} after {secs:.1f} s", cmd, err, first
        order_text = ""
        if check_order:
            try:
                issues = issue_order.check_logs(logdir, world, expected, STEPS)
                order_text = f"  one issue order ({issues} issues)"
            except (OSError, ValueError) as e:
                return False, f"{label}  issue order: {e}", cmd, "", first
        try:
            metrics = read_metrics(os.path.join(self.args.work, f"{tag}.jsonl"))
            params = read_params(os.path.join(self.args.work, f"{tag}.bin"))
        except (OSError, ValueError) as e:
            return False, f"{label}  no metrics or parameters: {e}", cmd, err, first
        (lerr, lwhere), (nerr, nwhere), nfirst = compare_metrics(metrics, ref_metrics)
        perr, pwhere, pl2 = compare_params(params, ref_params, self.layout)
        ok = (lerr <= LOSS_TOL and nfirst <= FIRST_NORM_TOL and nerr <= NORM_TOL and perr <= PARAM_MAX_TOL
              and pl2 <= PARAM_L2_TOL)
        factors = first.split()[1] if first.startswith("plan: ") else "?"
        text = (f"{label} = {factors:20s} loss {lerr:.1e} ({lwhere})  grad norm {nfirst:.1e} at step 1, {nerr:.1e} ({nwhere})  "
                f"params max {perr:.1e} ({pwhere}) L2 {pl2:.1e}{order_text}  "
                f"{secs:4.1f} s")
        return ok, text, cmd, "" if ok else err, first

    def refused(self, per_node, nodes, plan="mics:3"):
        """A plan that does not fit is refused before any work: exit 2, the reason on stderr."""
        world = per_node * nodes
        tag = f"refused-{plan.replace(':', '')}"
        cmd, (rc, out, err, secs) = self.launch(per_node, nodes, 1, 1, plan, tag, steps=2)
        errors = [l for l in err.splitlines() if l.startswith("amsp: error:")]
        started = any(l.startswith(("step ", "eval ")) for l in out.splitlines())
        wrote = os.path.exists(os.path.join(self.args.work, f"{tag}.jsonl"))
        ok = (rc == 2 and errors and all(f"--shard {plan}" in e and "does not fit" in e for e in errors)
              and len(set(errors)) == 1 and not started and not wrote)
        text = (f"{world} ranks ({per_node}x{nodes}) --shard {plan} refused: exit {rc}, {len(errors)} error "
                f"line(s), {'trained' if started else 'no training'}, "
                f"{'metrics written' if wrote else 'no metrics'}, {secs:.1f} s: "
                f"{errors[0] if errors else err.strip()[:200]}")
        return ok, text, cmd, "" if ok else err

    def auto(self, per_node, nodes, accum=1, batch=1):
        """--shard auto runs, names its plan on the first line and matches the reference."""
        ok, text, cmd, err, first = self.case(per_node, nodes, "auto", accum, batch, check_order=False)
        if first.startswith("plan: ") and "auto" in first:
            text += "\n     " + first[:160]
        else:
            ok = False
            text += f"\n     first line does not name the plan chosen by auto: {first[:160]!r}"
        return ok, text, cmd, err


def run_all(runner, cases, per_node_refuse, nodes_refuse, only):
    passed = failed = 0
    checks = [("case", c) for c in cases] + [("auto", (per_node_refuse, nodes_refuse)),
                                             ("refused", (per_node_refuse, nodes_refuse))]
    for kind, c in checks:
        if only and not any(o in f"{kind} {c}" for o in only):
            continue
        try:
            if kind == "case":
                ok, text, cmd, err, _ = runner.case(*c)
            elif kind == "auto":
                ok, text, cmd, err = runner.auto(*c)
            else:
                ok, text, cmd, err = runner.refused(*c)
        except (Failure, subprocess.TimeoutExpired) as e:
            ok, text, cmd, err = False, f"{kind} {c}: {e}", getattr(e, "cmd", None) or [], ""
        print(f"{'ok  ' if ok else 'FAIL'} {text}", flush=True)
        if not ok:
            print(f"     command: {' '.join(cmd)}")
            for line in err.strip().splitlines()[-8:]:
                print(f"     | {line}")
        passed += bool(ok)
        failed += not ok
    return passed, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["mpi", "slurm"])
    ap.add_argument("--amsp", required=True)
    ap.add_argument("--data", required=True, help="a corpus written by amsp data prepare")
    ap.add_argument("--work", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="both sides train in this precision (bf16: the bf16 cases and tolerances)")
    ap.add_argument("--cluster-scripts", default=os.path.join(REPO, "slurm", "local-cluster"))
    ap.add_argument("--model", default=os.path.join(REPO, "inputs", "models", "tiny.json"),
                    help="the model's config (default: the tiny preset)")
    ap.add_argument("--only", action="append", default=[],
                    help="run only the checks whose description contains TEXT, e.g. \"'zero3'\" (repeatable)")
    ap.add_argument("--engine-arg", action="append", default=[],
                    help="an option of both amsp train and amsp plan for every run and schedule, "
                         "e.g. --engine-arg=--reduction-slots=1 (repeatable)")
    args = ap.parse_args()
    args.amsp = os.path.abspath(args.amsp)
    args.data = os.path.abspath(args.data)
    args.cluster_scripts = os.path.abspath(args.cluster_scripts)
    args.model = os.path.abspath(args.model)
    stem = os.path.splitext(os.path.basename(args.model))[0]
    args.work = os.path.abspath(os.path.join(args.work, args.mode + ("-bf16" if args.precision == "bf16" else "") +
                                             ("" if stem == "tiny" else "-" + stem) +
                                             "".join("-" + re.sub(r"[^A-Za-z0-9]+", "", a) for a in args.engine_arg)))
    if args.precision == "bf16":
        global LOSS_TOL, FIRST_NORM_TOL, NORM_TOL, PARAM_MAX_TOL, PARAM_L2_TOL
        LOSS_TOL, FIRST_NORM_TOL, NORM_TOL, PARAM_MAX_TOL, PARAM_L2_TOL = BF16_TOLS

    if args.mode == "slurm":
        lacking = lc.missing(("srun", "sinfo", "scontrol", "slurmctld", "slurmd", "munged"))
        if lacking:
            print(f"SKIP: needs root and Slurm + munge (missing: {lacking})")
            return SKIP
        os.environ["PATH"] = os.environ.get("PATH", "") + lc.SBIN
    os.makedirs(args.work, exist_ok=True)

    t0 = time.time()
    try:
        with lc.deadline(DEADLINE):
            if args.mode == "mpi":
                cases = BF16_CASES if args.precision == "bf16" else MPI_CASES
                passed, failed = run_all(Runner(args), cases, 4, 1, args.only)
            else:
                with lc.local_cluster(args.cluster_scripts, os.path.join(args.work, "cluster")) as conf:
                    runner = Runner(args, clean_env({"SLURM_CONF": conf}))
                    passed, failed = run_all(runner, SLURM_CASES, 2, 4, args.only)
        print(f"{passed} passed, {failed} failed ({time.time() - t0:.0f} s)")
        return 1 if failed else 0
    except (Failure, lc.Interrupted, lc.ClusterError, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
