"""Reads an amsp checkpoint with h5py and NumPy only: the five-line recipe of
doc/checkpoints.md gives a state dict with Hugging Face names and shapes, and
every dataset's checksum recomputed in NumPy matches the stored one.

    /usr/bin/python3 h5py_check.py CHECKPOINT.h5
"""
import json
import sys

import h5py
import numpy as np

path = sys.argv[1]

# --- the recipe (doc/checkpoints.md) ---
with h5py.File(path, "r") as f:
    state = {(k if k.startswith("lm_head.") else "model." + k): np.asarray(v)
             for k, v in f["model"].items()}
    config = json.loads(f.attrs["model_config"])
# ---

h, L = config["hidden_size"], config["num_hidden_layers"]
kv = h // config["num_attention_heads"] * config["num_key_value_heads"]
expect = {
    "model.embed_tokens.weight": (config["vocab_size"], h),
    "model.norm.weight": (h,),
    "lm_head.weight": (config["vocab_size"], h),
    "model.layers.0.self_attn.q_proj.weight": (h, h),
    "model.layers.0.self_attn.k_proj.weight": (kv, h),
    f"model.layers.{L - 1}.mlp.down_proj.weight": (h, config["intermediate_size"]),
}
assert len(state) == 2 + 9 * L + 1, len(state)
for name, shape in expect.items():
    assert state[name].shape == shape and state[name].dtype == np.float32, (name, state[name].shape)


def mix64(z):
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def checksum(x):
    bits = np.ascontiguousarray(x, dtype=np.float32).reshape(-1).view(np.uint32).astype(np.uint64)
    i = np.arange(bits.size, dtype=np.uint64)
    return int(mix64(mix64(i) ^ bits).sum(dtype=np.uint64))


with np.errstate(over="ignore"), h5py.File(path, "r") as f:
    n = 0
    def visit(name, obj):
        global n
        if isinstance(obj, h5py.Dataset):
            assert checksum(obj[()]) == int(obj.attrs["checksum"]), name
            n += 1
    f.visititems(visit)
    print(f"h5py: {len(state)} tensors, step {int(f.attrs['step'])}, "
          f"plan {f.attrs['plan']}, {n} checksums match")
