#!/usr/bin/env python3
"""Checks amsp's LLaMA against Hugging Face transformers' LlamaForCausalLM.

For each configuration, amsp_hf_dump (validation/hf_dump.cpp) runs one forward
and backward of amsp's model on a random batch and writes the config, the
parameters, the batch, the logits, the loss and every gradient to HDF5. This
script builds the same model in transformers (eager attention, fp32, CPU),
loads the dumped parameters by name (strictly: every tensor must be there, and
nothing else), runs forward and backward on the same batch, and compares.

Error metric, per tensor: max|a - b| / max(max|b|, tiny), where a is amsp and
b is the reference; the error relative to the scale of the whole tensor, so
that entries near zero (most gradient entries) do not blow it up. A tensor
passes when this is at most --tolerance (default 1e-4). The loss is compared
the same way (|a - b| / |b|).

Usage (run with the python that validation/setup-python.sh prints):
  PY=$(validation/setup-python.sh)
  $PY validation/hf_compare.py --dump-bin build/validation/amsp_hf_dump --workdir /tmp/hf
  $PY validation/hf_compare.py --dump existing.h5        # check a dump made by hand
Exit status 0 when every configuration passes, 1 otherwise, 2 on bad usage.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

# Everything is built from the dump: never reach for the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import h5py
import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

TINY = 1e-30
# The dumped config's fields that LlamaConfig takes; anything else is dropped.
CONFIG_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "hidden_act",
    "attention_bias",
    "mlp_bias",
)

# The configurations run by default: (name, model, [field=value ...], batch, seq).
# Each is small enough to run in seconds on two cores.
CONFIGS = [
    # Multi-head attention (kv heads = heads), odd vocabulary and MLP widths.
    ("mha", "tiny",
     ["hidden_size=64", "num_hidden_layers=2", "num_attention_heads=4",
      "num_key_value_heads=4", "intermediate_size=172", "vocab_size=97"], 2, 16),
    # Grouped-query attention: the tiny preset as it is (4 heads, 2 kv heads).
    ("gqa-tiny", "tiny", [], 2, 32),
    # GQA with 4 query heads per kv head, rope_theta and rms_norm_eps of LLaMA 3.
    ("gqa4-rope500k", "tiny",
     ["hidden_size=96", "num_hidden_layers=2", "num_attention_heads=8",
      "num_key_value_heads=2", "intermediate_size=256", "vocab_size=131",
      "rope_theta=500000", "rms_norm_eps=1e-6"], 3, 24),
]


def rel_error(a, b):
    """(max abs error, max abs error relative to the reference tensor's scale)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf, math.inf
    if a.size == 0:
        return 0.0, 0.0
    abs_err = float(np.max(np.abs(a - b)))
    scale = max(float(np.max(np.abs(b))), TINY)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return math.inf, math.inf
    return abs_err, abs_err / scale


def hf_config(cfg):
    kwargs = {k: cfg[k] for k in CONFIG_FIELDS if k in cfg}
    return LlamaConfig(
        **kwargs,
        attn_implementation="eager",
        torch_dtype=torch.float32,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        use_cache=False,
        pretraining_tp=1,
        rope_scaling=None,
    )


def compare_dump(path, tolerance, dtype):
    """Checks one dump; prints a table; returns (passed, rows)."""
    with h5py.File(path, "r") as f:
        cfg = json.loads(f.attrs["config"])
        loss_amsp = float(f.attrs["loss"])
        tokens = torch.from_numpy(f["tokens"][...].astype(np.int64))
        targets = torch.from_numpy(f["targets"][...].astype(np.int64))
        logits_amsp = f["logits"][...]
        params = {name: f["params"][name][...] for name in f["params"]}
        grads = {name: f["grads"][name][...] for name in f["grads"]}

    torch.manual_seed(0)  # the random init is overwritten, but keep it reproducible
    model = LlamaForCausalLM(hf_config(cfg)).to(dtype)
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    model.train()  # no dropout anywhere (attention_dropout=0); train mode as in training
    state = {name: torch.from_numpy(value).to(dtype) for name, value in params.items()}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        print(f"{path}: parameters do not match transformers' model: {e}")
        return False, []
    if sorted(grads) != sorted(params):
        print(f"{path}: /grads and /params name different tensors")
        return False, []

    B, T = tokens.shape
    V = cfg["vocab_size"]
    logits = model(input_ids=tokens, use_cache=False).logits
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1)
    loss.backward()

    rows = []
    rows.append(("logits",) + rel_error(logits_amsp, logits.detach().numpy()))
    abs_loss = abs(loss_amsp - loss.item())
    rows.append(("loss", abs_loss, abs_loss / max(abs(loss.item()), TINY)))
    for name, p in model.named_parameters():
        rows.append((f"grad {name}",) + rel_error(grads[name], p.grad.numpy()))

    ok = True
    width = max(len(r[0]) for r in rows)
    lines = [f"  {'tensor':<{width}}  {'max abs err':>11}  {'max rel err':>11}  pass"]
    for name, abs_err, rel in rows:
        passed = rel <= tolerance
        ok &= passed
        lines.append(f"  {name:<{width}}  {abs_err:11.3e}  {rel:11.3e}  {'yes' if passed else 'NO'}")
    worst = max(rows, key=lambda r: r[2])
    lines.append(f"  worst of {len(rows)}: {worst[0]} {worst[2]:.3e}")
    print(f"{path}: B={B} T={T} loss amsp {loss_amsp:.6f} transformers {loss.item():.6f}")
    print("\n".join(lines))
    return ok, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dump-bin", help="amsp_hf_dump executable; runs the built-in configurations")
    ap.add_argument("--workdir", help="where dumps are written (default: a temporary directory)")
    ap.add_argument("--dump", action="append", default=[], help="check an existing dump (repeatable)")
    ap.add_argument("--only", action="append", default=[],
                    help="run only this built-in configuration (repeatable): "
                    + ", ".join(c[0] for c in CONFIGS))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--reference-dtype", choices=["float32", "float64"], default="float32",
                    help="precision of the transformers reference (float64 measures amsp's own error)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if not args.dump_bin and not args.dump:
        ap.error("give --dump-bin (run the built-in configurations) or --dump FILE")
    unknown = set(args.only) - {c[0] for c in CONFIGS}
    if unknown:
        ap.error(f"unknown configuration(s) {sorted(unknown)}; known: {[c[0] for c in CONFIGS]}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = torch.float64 if args.reference_dtype == "float64" else torch.float32

    print(f"hf_compare: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"reference {args.reference_dtype}, tolerance {args.tolerance:g} "
          f"(max|amsp-ref| / max|ref| per tensor)")

    jobs = [(os.path.basename(d), d) for d in args.dump]
    tmp = None
    if args.dump_bin:
        if not os.access(args.dump_bin, os.X_OK):
            print(f"hf_compare: --dump-bin {args.dump_bin}: not an executable file")
            return 2
        workdir = args.workdir
        if workdir is None:
            tmp = tempfile.TemporaryDirectory(prefix="amsp-hf-")
            workdir = tmp.name
        os.makedirs(workdir, exist_ok=True)
        for name, model, sets, batch, seq in CONFIGS:
            if args.only and name not in args.only:
                continue
            out = os.path.join(workdir, f"{name}.h5")
            cmd = [args.dump_bin, "--model", model, "--seed", str(args.seed),
                   "--batch", str(batch), "--seq", str(seq), "--out", out]
            for s in sets:
                cmd += ["--set", s]
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0:
                print(f"{name}: {' '.join(cmd)} failed with exit code {r.returncode}:\n{r.stdout}")
                jobs.append((name, None))
                continue
            jobs.append((name, out))

    passed = failed = 0
    for name, path in jobs:
        if path is None:
            failed += 1
            continue
        print(f"\n[{name}]")
        try:
            ok, _ = compare_dump(path, args.tolerance, dtype)
        except Exception as e:  # a malformed dump is a failure of this case, not a crash
            print(f"{path}: {type(e).__name__}: {e}")
            ok = False
        print(f"[{name}] {'PASS' if ok else 'FAIL'}")
        passed += ok
        failed += not ok
    if tmp is not None:
        tmp.cleanup()
    print(f"\nhf_compare: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
