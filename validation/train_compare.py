#!/usr/bin/env python3
"""Training steps of amsp checked step by step against PyTorch.

For each configuration below, the same initial weights and the same token windows go
through N optimizer steps of amsp (`amsp train`, on 1 or 4 MPI ranks, any shard plan)
and of PyTorch (transformers' LlamaForCausalLM, torch.optim.AdamW with weight decay on
the matrices only, an explicit warmup + cosine schedule, clip_grad_norm_):

  1. A Hugging Face model directory is written by transformers (save_pretrained:
     config.json + model.safetensors) with random weights; RMSNorm weights are drawn
     as 1 + 0.1 N(0, 1) so that decaying them by mistake shows.
  2. `amsp train --init-from DIR --data-order ORDER --param-trace TRACE --metrics M`
     trains from it; ORDER says which windows of the train split each step used,
     TRACE holds every parameter after every step.
  3. PyTorch loads DIR with from_pretrained and trains on exactly those windows: per
     micro-batch the summed cross-entropy over the step's tokens, backward, then
     clip_grad_norm_ (its return value: the norm before clipping), the learning rate
     of the step, AdamW.
  4. After every step: loss, gradient norm before clipping, learning rate (relative
     difference) and every parameter tensor (relative L2 difference |a - b| / |b|)
     must be within TOL = 1e-5. doc/validation.md argues the tolerance.

The schedule crosses from warmup into cosine decay, clipping triggers on some steps
(the script fails if it never does, or always does), and weight decay applies to the
matrices only (norms and the embedding are not decayed: amsp's default).

--precision bf16 runs CONFIGS_BF16 with `amsp train --precision bf16`; PyTorch keeps fp32
master parameters in the optimizer, computes with their bf16 roundings, and does every
matrix product as a bf16 GEMM summing in fp32 (Bf16Linear), everything else in fp32, as
amsp does (torch_steps_bf16). Two bf16 computations that differ only in the order of
their fp32 sums still round differently after a few products, so the bounds are bf16's:
loss within U/8, gradient norm and parameters within 2U (U = 2^-8), and every traced
parameter must be a bf16 value. doc/validation.md argues them.

Usage (the python of validation/setup-python.sh):
  PY=$(validation/setup-python.sh)
  $PY validation/train_compare.py --amsp build/amsp --data build/test-work/corpus.h5 \\
      --workdir /tmp/tc [--mpiexec mpiexec] [--only NAME] [--steps 10] [--precision bf16]
Prints one table row per step and configuration and ends with "N passed, M failed";
exit 1 on any failure.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "engine"))
import equivalence_test as eq  # noqa: E402  (the parameter layout of --final-params)
TOL = 1e-5
# --precision bf16: bounds on the relative differences in units of bf16's unit roundoff
# U = 2^-8 (8 significant bits); doc/validation.md argues them. The learning rate is
# computed in double on both sides whatever the precision.
U_BF16 = 2.0 ** -8
TOL_BF16 = {"loss": U_BF16 / 8, "grad_norm": 2 * U_BF16, "lr": TOL, "param": 2 * U_BF16}
LR, MIN_LR, WARMUP = 2e-3, 2e-4, 4
BETAS, EPS, WD, CLIP = (0.9, 0.95), 1e-6, 0.1, 2.0
SEQ = 32

# (name, preset, ranks, plan, per-rank batch B, micro-batches M, clip[, weights' dtype,
# shard size]). Weights stored in bf16 or fp16 are read exactly into fp32 by both sides.
CONFIGS = [
    ("tiny-bf16-sharded-4ranks-zero3", "tiny", 4, "zero3", 1, 1, CLIP, "bfloat16", "300KB"),
    ("tiny-fp16-1rank", "tiny", 1, "ddp", 4, 1, CLIP, "float16", None),
    ("tiny-1rank-M1", "tiny", 1, "ddp", 4, 1, CLIP),
    ("tiny-1rank-M3", "tiny", 1, "ddp", 2, 3, CLIP),
    ("tiny-4ranks-zero3-M1", "tiny", 4, "zero3", 1, 1, CLIP),
    ("tiny-4ranks-mixed-M3", "tiny", 4, "p=2x1,g=2x1,os=4x1", 1, 3, CLIP),
    ("small-1rank-M3", "small", 1, "ddp", 1, 3, 2.5),
    ("small-4ranks-zero3-M1", "small", 4, "zero3", 1, 1, 2.5),
]

# --precision bf16: amsp computes in bf16 mixed precision, PyTorch emulates the same
# arithmetic (torch_steps_bf16). Same fields as CONFIGS, fp32 weights on disk.
CONFIGS_BF16 = [
    ("bf16-tiny-1rank-M1", "tiny", 1, "ddp", 4, 1, CLIP),
    ("bf16-tiny-1rank-M3", "tiny", 1, "ddp", 2, 3, CLIP),
    ("bf16-tiny-4ranks-zero3-M1", "tiny", 4, "zero3", 1, 1, CLIP),
]


def learning_rate(step0, steps):
    """The schedule written out here, independently of amsp's: linear warmup to LR over
    WARMUP steps ((s+1)/WARMUP, so the first update is not zero), then a half cosine from
    LR to MIN_LR reached at the last step. step0 is 0-based."""
    if step0 < WARMUP:
        return LR * (step0 + 1) / WARMUP
    decay = steps - WARMUP
    progress = min(max((step0 - WARMUP) / (decay - 1), 0.0), 1.0)
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1.0 + math.cos(math.pi * progress))


def make_model_dir(preset, path, seed, dtype="float32", max_shard=None):
    """A Hugging Face directory with random weights, written by transformers itself:
    one model.safetensors, or shards with model.safetensors.index.json when max_shard
    is given; stored as dtype (float32, bfloat16 or float16)."""
    cfg = json.load(open(os.path.join(REPO, "inputs", "models", preset + ".json")))
    config = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")},
                         attn_implementation="eager", torch_dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    shutil.rmtree(path, ignore_errors=True)
    model.to(getattr(torch, dtype))
    model.save_pretrained(path, safe_serialization=True, **({"max_shard_size": max_shard} if max_shard else {}))


def run_amsp(args, name, model_dir, ranks, plan, batch, accum, clip):
    work = os.path.join(args.workdir, name)
    os.makedirs(work, exist_ok=True)
    files = {k: os.path.join(work, k) for k in ("metrics.jsonl", "order.jsonl", "trace.bin")}
    for f in files.values():
        if os.path.exists(f):
            os.remove(f)
    cmd = ([args.mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [
        args.amsp, "train", "--init-from", model_dir, "--data", args.data, "--steps", str(args.steps),
        "--seq-len", str(SEQ), "--batch-size", str(batch), "--grad-accum", str(accum), "--shard", plan,
        "--lr", str(LR), "--min-lr", str(MIN_LR), "--warmup-steps", str(WARMUP),
        "--beta1", str(BETAS[0]), "--beta2", str(BETAS[1]), "--adam-eps", str(EPS),
        "--weight-decay", str(WD), "--grad-clip", str(clip), "--eval-every", "0", "--eval-windows", "1",
        "--precision", args.precision, "--threads", "1", "--peak-tflops", "1", "--metrics", files["metrics.jsonl"],
        "--data-order", files["order.jsonl"], "--param-trace", files["trace.bin"]]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"amsp exited {p.returncode}: {' '.join(cmd)}\n{p.stderr[-2000:]}")
    metrics = [json.loads(l) for l in open(files["metrics.jsonl"]) if l.strip()]
    steps = {r["step"]: r for r in metrics if "loss" in r}
    order = [json.loads(l) for l in open(files["order.jsonl"]) if l.strip()]
    return steps, order, files["trace.bin"]


def torch_steps(model_dir, layout, train_tokens, order, ranks, batch, accum, clip, steps):
    """Yields (step, loss, grad norm before clipping, lr, {name: tensor}) after each step."""
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32,
                                             attn_implementation="eager")
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed_tokens" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, foreach=False)
    rows_per_micro = ranks * batch
    tokens_per_step = rows_per_micro * accum * SEQ
    for s in range(1, steps + 1):
        rec = order[s - 1]
        assert rec["step"] == s and rec["window_tokens"] == SEQ + 1 and len(rec["starts"]) == rows_per_micro * accum
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for m in range(accum):
            starts = rec["starts"][m * rows_per_micro:(m + 1) * rows_per_micro]
            w = torch.tensor(np.stack([train_tokens[a:a + SEQ + 1] for a in starts]).astype(np.int64))
            logits = model(input_ids=w[:, :-1]).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum")
            loss_sum += loss.item()
            (loss / tokens_per_step).backward()
        # The norm before clipping in double, as amsp sums it: clip_grad_norm_'s own
        # return value is summed in fp32 (1e-6 off on 14M parameters). It still clips.
        norm = math.sqrt(sum(float(torch.sum(p.grad.double() ** 2)) for p in model.parameters()))
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        lr = learning_rate(s - 1, steps)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        params = dict(model.named_parameters())
        yield s, loss_sum / tokens_per_step, norm, lr, {n: params[n].detach().numpy() for n, _ in layout}


def round_bf16(t):
    """t rounded to nearest even into bf16 and widened back: bf16 values held in fp32."""
    return t.to(torch.bfloat16).to(torch.float32)


class Bf16Linear(torch.autograd.Function):
    """y = x W^T as a GPU's bf16 tensor-core GEMM computes it: both inputs rounded to
    bf16, their exact products summed in fp32 (torch's sgemm; `acc` = torch.float64
    sums them in double instead), and the sum stored as amsp stores that product's
    output: rounded to bf16 where amsp's buffer is bf16 (round_y), kept in fp32 where it
    adds into the fp32 residual stream (the output and down projections). Backward the
    same for dx = dy W (dy rounded first; dx rounded where amsp's buffer is bf16 and
    one product writes it, round_dx: the q, k, v and gate, up inputs' gradients are one
    fused product's in amsp, summed here by autograd and rounded once at the norm's
    output, RoundBf16) and dW = dy^T x, accumulated into the gradient unrounded as
    amsp's GEMM does with beta = 1. Inputs and outputs stay fp32 tensors, so that
    everything between two products runs in fp32, as amsp's does. Written out rather
    than left to torch.autocast: torch 1.13's CPU bf16 GEMM sums dy W and dy^T x in
    bf16 (doc/validation.md)."""

    @staticmethod
    def forward(ctx, x, w, acc, round_y, round_dx):
        xr, wr = round_bf16(x), round_bf16(w)
        ctx.save_for_backward(xr, wr)
        ctx.acc, ctx.round_dx = acc, round_dx
        y = F.linear(xr.to(acc), wr.to(acc)).float()
        return round_bf16(y) if round_y else y

    @staticmethod
    def backward(ctx, dy):
        xr, wr = (t.to(ctx.acc) for t in ctx.saved_tensors)
        dyr = round_bf16(dy).to(ctx.acc)
        dx = (dyr @ wr).float()
        dw = (dyr.reshape(-1, dyr.shape[-1]).t() @ xr.reshape(-1, xr.shape[-1])).float()
        return round_bf16(dx) if ctx.round_dx else dx, dw, None, None, None


class RoundBf16(torch.autograd.Function):
    """A bf16 activation buffer of amsp's: the value rounded to bf16, and so is the
    gradient written into its bf16 gradient buffer (the normed inputs)."""

    @staticmethod
    def forward(ctx, x):
        return round_bf16(x)

    @staticmethod
    def backward(ctx, dx):
        return round_bf16(dx)


class RoundBf16Value(torch.autograd.Function):
    """A value amsp rounds to bf16 where it is made and uses at once, with no buffer
    for its gradient: q and k after RoPE, which amsp rotates in place in its bf16 q|k|v
    buffer (one rounding, no gradient buffer of their own: attention's backward rotates
    their gradients back in fp32 before their one rounding, the q and k projections'
    output gradients, rounded by Bf16Linear)."""

    @staticmethod
    def forward(ctx, x):
        return round_bf16(x)

    @staticmethod
    def backward(ctx, dx):
        return dx


# Where amsp's bf16 run keeps a product's output and input gradient in bf16 (the
# compute dtype) or fp32 (the residual stream): (round_y, round_dx) per linear layer.
BF16_ROUNDING = {"q_proj": (True, False), "k_proj": (True, False), "v_proj": (True, False),
                 "gate_proj": (True, False), "up_proj": (True, False),
                 "o_proj": (False, True), "down_proj": (False, True), "lm_head": (True, True)}


def round_like_amsp(model, acc):
    """Puts amsp's bf16 rounding points into transformers' LlamaForCausalLM: every
    linear layer a Bf16Linear, the norms' outputs bf16 buffers, q and k after RoPE
    rounded values."""
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            assert mod.bias is None
            rounding = BF16_ROUNDING[name.rsplit(".", 1)[-1]]
            mod.forward = (lambda m, r: lambda x: Bf16Linear.apply(x, m.weight, acc, *r))(mod, rounding)
        elif isinstance(mod, modeling_llama.LlamaRMSNorm):
            mod.forward = (lambda f: lambda x: RoundBf16.apply(f(x)))(mod.forward)
    rope = modeling_llama.apply_rotary_pos_emb
    modeling_llama.apply_rotary_pos_emb = (
        lambda *args, **kwargs: tuple(RoundBf16Value.apply(t) for t in rope(*args, **kwargs)))
    return rope


def torch_steps_bf16(model_dir, layout, train_tokens, order, ranks, plan, batch, accum, clip, steps,
                     arithmetic="emulated"):
    """torch_steps for `amsp train --precision bf16`. The optimizer owns fp32 master
    copies of the parameters; the model computes with round_bf16(master) (all of them:
    matrices, embedding, norm weights), written into its fp32 parameters before every
    step. Each micro-batch's gradient is taken from that model and reaches the master's
    fp32 gradient the way amsp's engine moves it on the plans used here:
      - 1 rank (ddp): backward adds into the fp32 gradient directly, so every gradient
        stays fp32 (the matrices' accumulated by their GEMM unrounded);
      - zero3: each rank's gradient is rounded to bf16 (a bf16 buffer), the ranks' are
        summed in fp32 and rounded once (the bf16 reduce-scatter), then added in fp32.
    The norm before clipping is summed in double from the fp32 gradient; clipping and
    AdamW run in fp32 on the master. arithmetic: "emulated" (Bf16Linear), "emulated-fp64"
    (Bf16Linear summing in double: a second valid reference) or "autocast" (stock
    torch.autocast instead of Bf16Linear); the last two for comparison only
    (doc/validation.md)."""
    if ranks != 1 and plan != "zero3":
        raise RuntimeError(f"bf16: the PyTorch side knows 1 rank or zero3, not {ranks} ranks {plan}")
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32,
                                             attn_implementation="eager")
    model.train()
    emulate = arithmetic != "autocast"
    if emulate:
        rope = round_like_amsp(model, torch.float64 if arithmetic == "emulated-fp64" else torch.float32)
    try:
        yield from bf16_steps(model, train_tokens, order, ranks, batch, accum, clip, steps, layout, emulate)
    finally:
        if emulate:
            modeling_llama.apply_rotary_pos_emb = rope


def bf16_steps(model, train_tokens, order, ranks, batch, accum, clip, steps, layout, emulate):
    """torch_steps_bf16's steps on a prepared model."""
    named = list(model.named_parameters())
    master = {n: torch.nn.Parameter(p.detach().clone()) for n, p in named}
    decay = [master[n] for n, p in named if p.dim() == 2 and "embed_tokens" not in n]
    no_decay = [master[n] for n, p in named if not (p.dim() == 2 and "embed_tokens" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, foreach=False)
    tokens_per_step = ranks * batch * accum * SEQ
    for s in range(1, steps + 1):
        rec = order[s - 1]
        assert rec["step"] == s and rec["window_tokens"] == SEQ + 1 and len(rec["starts"]) == ranks * batch * accum
        with torch.no_grad():
            for n, p in named:
                p.copy_(round_bf16(master[n]))
        for n, _ in named:
            master[n].grad = torch.zeros_like(master[n])
        loss_sum = 0.0
        for m in range(accum):
            reduced = {n: torch.zeros_like(p) for n, p in named}
            for r in range(ranks):
                # Global row order: row = (micro-batch * ranks + rank) * batch + b.
                first = (m * ranks + r) * batch
                w = torch.tensor(np.stack([train_tokens[a:a + SEQ + 1]
                                           for a in rec["starts"][first:first + batch]]).astype(np.int64))
                model.zero_grad(set_to_none=True)
                if emulate:
                    logits = model(input_ids=w[:, :-1]).logits
                else:
                    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                        logits = model(input_ids=w[:, :-1]).logits
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                       reduction="sum")
                loss_sum += loss.item()
                (loss / tokens_per_step).backward()
                with torch.no_grad():
                    for n, p in named:
                        reduced[n] += p.grad if ranks == 1 else round_bf16(p.grad)
            with torch.no_grad():
                for n, _ in named:
                    master[n].grad += reduced[n] if ranks == 1 else round_bf16(reduced[n])
        norm = math.sqrt(sum(float(torch.sum(p.grad.double() ** 2)) for p in master.values()))
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(list(master.values()), clip)
        lr = learning_rate(s - 1, steps)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        # What amsp's --param-trace holds in bf16: the parameters the model computes with.
        yield s, loss_sum / tokens_per_step, norm, lr, {n: round_bf16(master[n].detach()).numpy() for n, _ in layout}


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def check(args, name, preset, ranks, plan, batch, accum, clip, dtype="float32", max_shard=None, *, train_tokens):
    model_dir = os.path.join(args.workdir, f"hf-{name}")
    make_model_dir(preset, model_dir, seed=1234, dtype=dtype, max_shard=max_shard)
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    # --param-trace holds amsp's layout order (embed, layers.0 .., head), not torch's.
    layout = eq.tensor_layout(os.path.join(REPO, "inputs", "models", preset + ".json"))
    got, order, trace = run_amsp(args, name, model_dir, ranks, plan, batch, accum, clip)
    total = sum(n for _, n in layout)
    flat = np.memmap(trace, dtype="<f4", mode="r")
    if flat.size != total * args.steps or len(order) != args.steps:
        raise RuntimeError(f"trace of {flat.size} floats, {len(order)} order lines; expected "
                           f"{args.steps} steps of {total}")
    # In bf16 the trace holds the parameters the model computed with: bf16 values.
    not_bf16 = np.count_nonzero(flat.view("<u4") & 0xFFFF) if args.precision == "bf16" else 0
    worst = {"loss": 0.0, "grad_norm": 0.0, "lr": 0.0, "param": (0.0, "")}
    clipped = 0
    print(f"{name}: {ranks} rank(s) {plan} B={batch} M={accum} clip={clip}, {args.steps} steps, "
          f"weights {dtype} in {len(files)} file(s), precision {args.precision}")
    print("  step        loss  err     grad norm  err     lr         err     worst param L2 (tensor)")
    if args.precision == "bf16":
        steps = torch_steps_bf16(model_dir, layout, train_tokens, order, ranks, plan, batch, accum, clip,
                                 args.steps, arithmetic=args.torch_bf16)
    else:
        steps = torch_steps(model_dir, layout, train_tokens, order, ranks, batch, accum, clip, args.steps)
    for s, loss, norm, lr, params in steps:
        r = got[s]
        e_loss, e_lr = rel(r["loss"], loss), rel(r["lr"], lr)
        e_norm = rel(r["grad_norm"], norm)
        clipped += norm > clip
        base = (s - 1) * total
        step_worst, where = 0.0, ""
        for n, k in layout:
            a = np.asarray(flat[base:base + k], dtype=np.float64)
            b = params[n].astype(np.float64).ravel()
            base += k
            e = math.sqrt(float(np.sum((a - b) ** 2)) / max(float(np.sum(b * b)), 1e-60))
            if not e <= step_worst:  # NaN counts as worst
                step_worst, where = e, n
        print(f"  {s:4d}  {loss:10.6f}  {e_loss:.1e}  {norm:9.4f}  {e_norm:.1e}  {lr:.3e}  {e_lr:.1e}  "
              f"{step_worst:.1e} ({where})")
        worst["loss"] = max(worst["loss"], e_loss)
        worst["grad_norm"] = max(worst["grad_norm"], e_norm)
        worst["lr"] = max(worst["lr"], e_lr)
        if not step_worst <= worst["param"][0]:
            worst["param"] = (step_worst, f"{where}, step {s}")
    tol = TOL_BF16 if args.precision == "bf16" else dict.fromkeys(("loss", "grad_norm", "lr", "param"), TOL)
    problems = [f"{k} {worst[k]:.1e} > {tol[k]}" for k in ("loss", "grad_norm", "lr") if not worst[k] <= tol[k]]
    if not worst["param"][0] <= tol["param"]:
        problems.append(f"parameters {worst['param'][0]:.1e} > {tol['param']} ({worst['param'][1]})")
    if not_bf16:
        problems.append(f"{not_bf16} traced parameter values are not bf16 values")
    if clip > 0 and not 0 < clipped < args.steps:
        problems.append(f"clipping triggered on {clipped} of {args.steps} steps; the check needs some of each")
    ok = not problems
    print(f"{'ok  ' if ok else 'FAIL'} {name}: worst loss {worst['loss']:.1e}, grad norm {worst['grad_norm']:.1e}, "
          f"lr {worst['lr']:.1e}, parameters {worst['param'][0]:.1e} ({worst['param'][1]}); clipped "
          f"{clipped}/{args.steps} steps" + (f"; {'; '.join(problems)}" if problems else ""), flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--amsp", required=True)
    ap.add_argument("--data", required=True, help="a byte-level corpus from `amsp data prepare`")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", action="append", default=[], help="configurations whose name contains TEXT")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="amsp's --precision; bf16 runs the CONFIGS_BF16 configurations")
    ap.add_argument("--torch-bf16", choices=("emulated", "emulated-fp64", "autocast"), default="emulated",
                    help="with bf16: how PyTorch computes in bf16 (emulated-fp64: matrix products "
                         "summed in double; autocast: stock torch.autocast; both for comparison "
                         "only, the check uses emulated)")
    args = ap.parse_args()
    if args.steps < WARMUP + 3:
        ap.error(f"--steps must be at least {WARMUP + 3} to cross from warmup into the cosine decay")
    args.amsp, args.data = os.path.abspath(args.amsp), os.path.abspath(args.data)
    os.makedirs(args.workdir, exist_ok=True)
    torch.set_num_threads(1)
    with h5py.File(args.data, "r") as f:
        train_tokens = np.asarray(f["train/tokens"][:], dtype=np.int64)
    passed = failed = 0
    for c in CONFIGS_BF16 if args.precision == "bf16" else CONFIGS:
        if args.only and not any(o in c[0] for o in args.only):
            continue
        try:
            ok = check(args, *c, train_tokens=train_tokens)
        except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError, AssertionError) as e:
            print(f"FAIL {c[0]}: {e}", flush=True)
            ok = False
        passed += ok
        failed += not ok
    print(f"train_compare: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
