#!/usr/bin/env python3
"""PyTorch beside amsp in the GPU check (validation/gpu/check.sh): the same model,
the same initial weights and the same token windows, so that the first losses can
be compared and the throughputs stand side by side.

  torch_reference.py init --config PRESET.json --out DIR [--seed N]
      writes a Hugging Face model directory with random weights (transformers'
      LlamaForCausalLM, save_pretrained); amsp starts from it with --init-from.
  torch_reference.py train --model DIR --data CORPUS.h5 --order ORDER.jsonl
                           --steps N --mode eager|compile [--device cuda|cpu]
      trains on exactly the windows amsp's --data-order file lists: bf16 autocast
      over fp32 parameters (amsp's --precision bf16: fp32 master weights, bf16
      matrix products), SDPA attention where this torch has it, AdamW with the
      hyperparameters below (amsp's flags in check.py match them). Prints one JSON
      line per step and a last line "result {...}": median step time, tokens/s,
      peak memory, the attention implementation used. With --profile-steps K, K
      more steps on the last windows (after the timed ones, so they time nothing
      else) under torch.profiler: the result's "profile" has the time per step of
      each GPU kernel (on a CPU device, of each operator), the largest first.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

# The optimizer both sides run (check.py passes the same to amsp train).
LR, BETAS, EPS, WD, CLIP = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


def init(a):
    cfg = json.load(open(a.config))
    config = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(a.seed)
    model = LlamaForCausalLM(config)
    model.to(torch.float32).save_pretrained(a.out, safe_serialization=True)
    print(f"init: {sum(p.numel() for p in model.parameters()) / 1e9:.3f}B parameters in {a.out}")


def windows(a, order):
    with h5py.File(a.data, "r") as f:
        tokens = f["train/tokens"]
        for rec in order:
            n = rec["window_tokens"]
            yield np.stack([tokens[s:s + n] for s in rec["starts"]]).astype(np.int64)


def train(a):
    device = torch.device(a.device)
    attn = "sdpa" if has_sdpa() else "eager"
    # fp32 on disk, so fp32 here under any transformers version's default dtype.
    model = LlamaForCausalLM.from_pretrained(a.model, attn_implementation=attn).to(device)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed_tokens" not in n)]
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, **fused)
    step_fn = model
    if a.mode == "compile":
        if not hasattr(torch, "compile"):
            print("result " + json.dumps({"error": f"torch {torch.__version__} has no torch.compile"}))
            return 0
        step_fn = torch.compile(model)
    order = [json.loads(l) for l in open(a.order) if l.strip()][:a.steps]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def step(w):
        batch = torch.from_numpy(w).to(device, non_blocking=True)
        inputs, targets = batch[:, :-1], batch[:, 1:]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = step_fn(input_ids=inputs).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        return loss.item(), targets.numel()  # the step's one synchronisation, as amsp's

    times, losses, tokens_per_step, seen = [], [], 0, []
    for rec, w in zip(order, windows(a, order)):
        sync()
        t0 = time.perf_counter()
        value, tokens_per_step = step(w)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(value)
        seen.append(w)
        print(json.dumps({"step": rec["step"], "loss": value, "step_ms": times[-1]}), flush=True)
    skip = 3 if a.mode == "compile" else 2
    timed = times[skip:] or times
    med = statistics.median(timed)
    result = {"mode": a.mode, "attention": attn, "torch": torch.__version__, "steps": len(times),
              "losses": losses, "step_ms_median": med, "tokens_per_step": tokens_per_step,
              "tokens_per_s": tokens_per_step / med * 1e3,
              "peak_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None}
    if a.profile_steps > 0:
        result["profile"] = profile(seen[-a.profile_steps:], step, device, sync)
    print("result " + json.dumps(result), flush=True)
    return 0 if all(math.isfinite(l) for l in losses) else 1


def profile(ws, step, device, sync):
    """Time per step of each kernel (CUDA) or operator (CPU) over the steps on windows ws,
    by torch.profiler, the largest 25 first."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    cuda = device.type == "cuda"
    with torch_profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for w in ws:
            step(w)
        sync()
    rows = []
    for e in prof.key_averages():
        if cuda:  # kernels, copies and sets: time on the device (the attribute's name varies by release)
            us = next((getattr(e, k) for k in ("self_device_time_total", "self_cuda_time_total")
                       if getattr(e, k, 0)), 0)
        else:
            us = e.self_cpu_time_total
        if us > 0:
            rows.append({"name": e.key, "calls_per_step": e.count / len(ws), "ms_per_step": us / 1e3 / len(ws)})
    rows.sort(key=lambda r: -r["ms_per_step"])
    return {"steps": len(ws), "activity": "cuda" if cuda else "cpu",
            "total_ms_per_step": sum(r["ms_per_step"] for r in rows), "kernels": rows[:25]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init")
    i.add_argument("--config", required=True)
    i.add_argument("--out", required=True)
    i.add_argument("--seed", type=int, default=1)
    t = sub.add_parser("train")
    t.add_argument("--model", required=True)
    t.add_argument("--data", required=True)
    t.add_argument("--order", required=True)
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--mode", choices=("eager", "compile"), default="eager")
    t.add_argument("--device", default="cuda")
    t.add_argument("--profile-steps", type=int, default=0)
    a = ap.parse_args()
    if a.cmd == "init":
        init(a)
        return 0
    return train(a)


if __name__ == "__main__":
    sys.exit(main())
