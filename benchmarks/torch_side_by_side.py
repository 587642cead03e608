#!/usr/bin/env python3
"""Training throughput of amsp next to PyTorch + transformers on the same model.

Both sides train the same LLaMA (the config JSON of inputs/models/<preset>.json,
fp32, CPU) with AdamW at the same batch size, sequence length and thread count:

  - PyTorch: transformers' LlamaForCausalLM (eager attention), torch.optim.AdamW,
    gradient clipping at 1.0, torch.set_num_threads(N), OMP_NUM_THREADS and
    OPENBLAS_NUM_THREADS=N, OMP_WAIT_POLICY=PASSIVE (see run_torch), on random
    tokens (throughput does not depend on the token values).
  - amsp: `amsp train` with OMP_NUM_THREADS=N on a token dataset; its tokens/s
    are computed from the step_ms of its metrics file.

Steps before --warmup are left out of both. Prints one table row per run:
model, batch, seq, threads, amsp tokens/s, torch tokens/s, ratio (amsp/torch).

Run with the python that validation/setup-python.sh prints:
  PY=$(validation/setup-python.sh)
  $PY benchmarks/torch_side_by_side.py --amsp build/amsp --model small --batch 4 --seq 256
"""

import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import time

# Models are built from config JSON: never reach for the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The LlamaConfig fields taken from a preset; everything else is fixed below.
CONFIG_FIELDS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
    "rope_theta", "hidden_act",
)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def load_preset(model):
    path = model if model.endswith(".json") or os.sep in model else None
    if path is None:
        inputs = os.environ.get("AMSP_INPUTS", os.path.join(REPO, "inputs"))
        path = os.path.join(inputs, "models", model + ".json")
    if not os.path.isfile(path):
        sys.exit(f"torch_side_by_side: model '{model}': no file {path}")
    with open(path) as f:
        return json.load(f)


# --- PyTorch ------------------------------------------------------------------

def openblas_core_for_this_cpu():
    """The OpenBLAS core amsp picks on this CPU (same rule as kernels/cpu/matmul.cpp)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return None
    if all(x in flags for x in ("avx512f", "avx512bw", "avx512vl", "avx512dq")):
        return "SkylakeX"
    if "avx2" in flags and "fma" in flags:
        return "Haswell"
    if "avx" in flags:
        return "SandyBridge"
    return None


def run_torch(cfg, batch, seq, steps, warmup, threads, lr, seed):
    """Runs torch_worker in a child process, so that the thread counts of OpenMP
    and of the BLAS library (read once, when they load) are those asked for.

    Debian's torch does its matmuls in OpenBLAS's pthread build, whose threads and
    torch's spinning OpenMP threads starve each other: with both at 2 threads on
    2 cores, steps took 3-20x longer than with either at 1. OMP_WAIT_POLICY=PASSIVE
    (unless set already) stops OpenMP's spinning and gives torch its best 2-thread
    times measured here."""
    job = dict(cfg=cfg, batch=batch, seq=seq, steps=steps, warmup=warmup, threads=threads,
               lr=lr, seed=seed)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # amsp re-selects OpenBLAS's kernels when OpenBLAS does not know the CPU and
    # falls back to its generic SSE3 ones (kernels/cpu/matmul.cpp). Give torch's
    # OpenBLAS the same kernels, so the comparison is of the trainers, not of
    # which sgemm each happened to load.
    core = openblas_core_for_this_cpu()
    if core:
        env.setdefault("OPENBLAS_CORETYPE", core)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-worker", json.dumps(job)],
                       stdout=subprocess.PIPE, env=env, text=True)
    if r.returncode != 0:
        sys.exit(f"torch_side_by_side: the PyTorch run failed ({r.returncode})")
    return json.loads(r.stdout.strip().splitlines()[-1])


def torch_worker(cfg, batch, seq, steps, warmup, threads, lr, seed):
    import torch
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    config = LlamaConfig(
        **{k: cfg[k] for k in CONFIG_FIELDS if k in cfg},
        attn_implementation="eager", torch_dtype=torch.float32, tie_word_embeddings=False,
        attention_dropout=0.0, use_cache=False)
    model = LlamaForCausalLM(config).float().train()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.dim() < 2 or "embed_tokens" in name else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    V = config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    times, losses = [], []
    for step in range(steps):
        data = torch.randint(0, V, (batch, seq + 1), generator=gen)
        inputs, targets = data[:, :-1], data[:, 1:]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=inputs, use_cache=False).logits
        loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        log(f"  torch step {step + 1}/{steps}: loss {losses[-1]:.4f}, {times[-1] * 1000:.0f} ms")
    timed = times[warmup:]
    print(json.dumps({"tokens_per_s": batch * seq * len(timed) / sum(timed),
                      "step_ms": 1000 * sum(timed) / len(timed), "loss_first": losses[0],
                      "loss_last": losses[-1], "torch_threads": torch.get_num_threads()}))


# --- amsp ---------------------------------------------------------------------

def corpus_files():
    """Text for a dataset: inputs/corpus/files.sh's list if it gives one, else any text here."""
    script = os.path.join(REPO, "inputs", "corpus", "files.sh")
    if os.path.isfile(script):
        r = subprocess.run(["bash", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True, cwd=REPO)
        files = [line.strip() for line in r.stdout.splitlines() if line.strip()]
        files = [f if os.path.isabs(f) else os.path.join(REPO, f) for f in files]
        files = [f for f in files if os.path.isfile(f)]
        if r.returncode == 0 and files:
            return files
    files = sorted(glob.glob("/usr/share/common-licenses/*"))
    files += sorted(glob.glob(os.path.join(REPO, "doc", "*.md")))
    files += sorted(glob.glob(os.path.join(REPO, "src", "*", "*.h")))
    return [f for f in files if os.path.isfile(f)]


def prepare_data(amsp, workdir):
    out = os.path.join(workdir, "bench-data.h5")
    files = corpus_files()
    if not files:
        sys.exit("torch_side_by_side: no text found to prepare a dataset; give --data")
    cmd = [amsp, "data", "prepare", "--input", *files, "--output", out]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"torch_side_by_side: amsp data prepare failed ({r.returncode}):\n{r.stdout}")
    log("  " + r.stdout.strip())
    return out


def run_amsp(amsp, model, data, batch, seq, steps, warmup, threads, lr, workdir):
    metrics = os.path.join(workdir, f"amsp-metrics-{model_tag(model)}-b{batch}-t{seq}-p{threads}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [amsp, "train", "--model", model, "--data", data, "--steps", str(steps),
           "--batch-size", str(batch), "--seq-len", str(seq), "--grad-accum", "1",
           "--lr", str(lr), "--metrics", metrics, "--eval-every", "0"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    log("  " + " ".join(cmd))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                       cwd=workdir)
    if r.returncode != 0:
        sys.exit(f"torch_side_by_side: amsp train failed ({r.returncode}):\n{r.stdout}")
    rows = []
    with open(metrics) as f:
        for line in f:
            line = line.strip()
            if line:
                rec = json.loads(line)
                if "step" in rec and "step_ms" in rec:
                    rows.append(rec)
    rows.sort(key=lambda rec: rec["step"])
    timed = rows[warmup:]
    if not timed:
        sys.exit(f"torch_side_by_side: {metrics} has {len(rows)} steps, none after {warmup} warm-up steps")
    total_ms = sum(rec["step_ms"] for rec in timed)
    return {"tokens_per_s": batch * seq * len(timed) / (total_ms / 1000),
            "step_ms": total_ms / len(timed), "loss_first": rows[0].get("loss"),
            "loss_last": rows[-1].get("loss"), "mfu": timed[-1].get("mfu")}


def model_tag(model):
    return os.path.splitext(os.path.basename(model))[0]


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--torch-worker":
        torch_worker(**json.loads(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--amsp", default=os.path.join(REPO, "build", "amsp"), help="the amsp executable")
    ap.add_argument("--data", help="token dataset for amsp (default: prepared from the corpus)")
    ap.add_argument("--model", default="small", help="preset name or config JSON (default small)")
    ap.add_argument("--batch", type=int, nargs="+", default=[4], help="batch size(s)")
    ap.add_argument("--seq", type=int, nargs="+", default=[256], help="sequence length(s)")
    ap.add_argument("--threads", type=int, nargs="+", default=[os.cpu_count() or 1],
                    help="thread count(s) (default: all cores)")
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=3, help="first steps left out of the timing")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--workdir", help="where the dataset and metrics go (default: a temporary directory)")
    ap.add_argument("--skip-amsp", action="store_true", help="run the PyTorch side only")
    ap.add_argument("--skip-torch", action="store_true", help="run the amsp side only")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        ap.error(f"--steps {args.steps} must exceed --warmup {args.warmup}")

    cfg = load_preset(args.model)
    tmp = None
    workdir = args.workdir
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="amsp-bench-")
        workdir = tmp.name
    os.makedirs(workdir, exist_ok=True)

    data = args.data
    if not args.skip_amsp:
        args.amsp = os.path.abspath(args.amsp)
        if not os.access(args.amsp, os.X_OK):
            sys.exit(f"torch_side_by_side: --amsp {args.amsp}: not an executable (build it, or --skip-amsp)")
        if data is None:
            data = prepare_data(args.amsp, workdir)
        data = os.path.abspath(data)

    load = os.getloadavg()[0]
    if load > 0.5:
        log(f"torch_side_by_side: warning: load average {load:.1f} before starting; other work "
            f"on the cores skews both sides (OpenMP threads that spin suffer most)")

    results = []
    for threads in args.threads:
        for batch in args.batch:
            for seq in args.seq:
                log(f"{model_tag(args.model)} batch {batch} seq {seq} threads {threads}:")
                row = {"model": model_tag(args.model), "batch": batch, "seq": seq, "threads": threads,
                       "steps": args.steps, "warmup": args.warmup}
                if not args.skip_amsp:
                    row["amsp"] = run_amsp(args.amsp, args.model, data, batch, seq, args.steps,
                                           args.warmup, threads, args.lr, workdir)
                if not args.skip_torch:
                    row["torch"] = run_torch(cfg, batch, seq, args.steps, args.warmup, threads,
                                             args.lr, args.seed)
                results.append(row)

    def fmt(x):
        return f"{x:.0f}" if isinstance(x, (int, float)) and math.isfinite(x) else "-"

    import torch
    import transformers
    print(f"amsp vs PyTorch {torch.__version__} + transformers {transformers.__version__}, fp32 CPU, "
          f"AdamW, {args.steps} steps ({args.warmup} warm-up left out), load average {load:.1f}")
    header = ("model", "batch", "seq", "threads", "amsp tok/s", "torch tok/s", "ratio")
    table = [header]
    for r in results:
        a = r.get("amsp", {}).get("tokens_per_s")
        t = r.get("torch", {}).get("tokens_per_s")
        ratio = f"{a / t:.2f}" if a and t else "-"
        table.append((r["model"], str(r["batch"]), str(r["seq"]), str(r["threads"]), fmt(a), fmt(t), ratio))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
