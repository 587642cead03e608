#!/usr/bin/env python3
"""Block quantization (doc/compression.md) against NumPy, bit for bit.

NumPy redoes the format and the float32 arithmetic from the document alone
(amax, inv = qmax / amax, rint half to even, the clamp, the scale, the 2^64
step for tiny blocks, NaN scales for non-finite blocks, the nibble packing, the
padding; q * scale; the sum over records in order with each product and each
addition rounded to float32), and amsp_quant_tool runs the same cases on the CPU
backend and on the CUDA backend (its emulation on a machine without a GPU, the
GPU in a CUDA build). Records must be the same bytes, dequantized values and
sums the same bits (a NaN may differ in its payload: GPUs make their own).

  quant_compare.py --tool build/validation/amsp_quant_tool --workdir DIR [--device cpu --device cuda]

Prints one line per device and exits 0 when every case agrees; else one FAIL
line per disagreement (the case, the output, the first differing element) and
exits 1.
"""
import argparse
import os
import subprocess
import sys

import numpy as np

F32 = np.float32
NAN_SCALE = np.uint32(0x7FC00000)


def blocks(n, block):
    return n // block + (n % block != 0)


def record_bytes(n, bits, block):
    codes = n if bits == 8 else (n + 1) // 2
    return (4 * blocks(n, block) + codes + 3) // 4 * 4


def bf16_round(x):
    """float32 values rounded to bfloat16, to nearest even, as float32; NaN stays NaN."""
    u = x.astype(F32).view(np.uint32).astype(np.uint64)
    r = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(F32)
    return np.where(np.isnan(x), F32("nan"), r).astype(F32)


def quantize_chunk(x, bits, block):
    """One chunk's record (bytes), its codes and its scales per element."""
    n = len(x)
    qmax = 2 ** (bits - 1) - 1
    nb = blocks(n, block)
    scales = np.zeros(nb, np.uint32)
    codes = np.zeros(n, np.int64)
    for b in range(nb):
        seg = x[b * block:(b + 1) * block]
        if not np.all(np.isfinite(seg)):
            scales[b] = NAN_SCALE
            continue
        amax = np.max(np.abs(seg))
        if amax == 0:
            continue
        pre = F32(2.0 ** 64) if amax < F32(2.0 ** -64) else F32(1)
        inv = F32(qmax) / (amax * pre)
        t = np.rint((seg * pre) * inv)
        assert t.dtype == np.float32
        codes[b * block:(b + 1) * block] = np.clip(t, -qmax, qmax).astype(np.int64)
        scales[b] = np.array([amax / F32(qmax)], F32).view(np.uint32)[0]
    if bits == 8:
        code_bytes = codes.astype(np.int8).view(np.uint8)
    else:
        nib = (np.concatenate([codes, np.zeros(n % 2, np.int64)]) & 0xF).astype(np.uint8)
        code_bytes = nib[0::2] | (nib[1::2] << 4)
    raw = scales.astype("<u4").tobytes() + code_bytes.tobytes()
    raw += bytes(-len(raw) % 4)
    per_element = scales.view(F32)[np.arange(n) // block]
    return raw, codes, per_element


def reference(x, n, records, bits, block, out):
    raw = b""
    products = []
    for r in range(records):
        rec, codes, scale = quantize_chunk(x[r * n:(r + 1) * n], bits, block)
        raw += rec
        products.append(codes.astype(F32) * scale)
    deq = np.concatenate(products) if records else np.zeros(0, F32)
    total = products[0].copy() if records else np.zeros(n, F32)
    for p in products[1:]:
        total = total + p  # float32 + float32: one rounding, never fused
    assert deq.dtype == np.float32 and total.dtype == np.float32
    if out == "bf16":
        deq, total = bf16_round(deq), bf16_round(total)
    return raw, deq, total


def inputs(n, records, bits, block, rng, kind_shift):
    """Each block the next kind of awkward values (kernels/cpu/quant_test_values.h's kinds)."""
    x = np.zeros(records * n, F32)
    qmax = 2 ** (bits - 1) - 1
    k = kind_shift
    for r in range(records):
        for b in range(blocks(n, block)):
            lo, hi = r * n + b * block, r * n + min(n, (b + 1) * block)
            m = hi - lo
            kind = k % 10
            k += 1
            if kind == 0:
                v = rng.standard_normal(m) * 10.0 ** rng.integers(-3, 4)
            elif kind == 1:  # ties: amax = qmax, the rest k + 1/2
                v = (rng.integers(0, qmax, m) + 0.5) * rng.choice([-1, 1], m)
                v[rng.integers(0, m)] = -qmax
            elif kind == 2:
                v = rng.standard_normal(m)
                v[0] = -40
            elif kind == 3:
                v = rng.standard_normal(m)
                v[-1] = 40
            elif kind == 4:
                v = rng.standard_normal(m)
                v[rng.integers(0, m)] = 1e30
            elif kind == 5:  # denormals
                v = rng.integers(-50, 51, m) * 2.0 ** -149
            elif kind == 6:
                v = np.where(np.arange(m) % 3 == 0, 0.0, -0.0)
            elif kind == 7:
                v = rng.standard_normal(m) * 1e-21
            elif kind == 8:
                v = rng.standard_normal(m) * 1e-19
            else:
                v = rng.standard_normal(m) * 1e36
                v[rng.integers(0, m)] = float(np.frombuffer(np.uint32(0x7F7F0000).tobytes(), F32)[0])
            x[lo:hi] = np.asarray(v, np.float64).astype(F32)
    return x


def cases(rng):
    """(bits, block, n, records, in, out, values)."""
    out = []
    shapes = [(1, 37, 2), (3, 100, 3), (4, 99, 2), (32, 257, 2), (33, 257, 3), (300, 1001, 2),
              (1 << 40, 777, 3), (777, 777, 1), (64, 1, 4), (2048, 5000, 2), (256, 4097, 1)]
    i = 0
    for bits in (8, 4):
        for block, n, records in shapes:
            for in_dtype, out_dtype in (("fp32", "fp32"), ("bf16", "bf16")) if i % 2 else (("fp32", "bf16"), ("bf16", "fp32")):
                x = inputs(n, records, bits, block, rng, i)
                if in_dtype == "bf16":
                    x = bf16_round(x)
                out.append((bits, block, n, records, in_dtype, out_dtype, x))
                i += 1
    # Non-finite values poison their block only.
    for bits in (8, 4):
        x = inputs(100, 2, bits, 15, rng, 0)
        x[3], x[40], x[199] = np.nan, np.inf, -np.inf
        out.append((bits, 15, 100, 2, "fp32", "fp32", x))
    return out


def same_bits(got, want):
    """Indices where float32 arrays differ in bits (two NaNs agree)."""
    differ = (got.view(np.uint32) != want.view(np.uint32)) & ~(np.isnan(got) & np.isnan(want))
    return np.flatnonzero(differ)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--device", action="append", choices=["cpu", "cuda"])
    args = ap.parse_args()
    devices = args.device or ["cpu", "cuda"]
    os.makedirs(args.workdir, exist_ok=True)
    rng = np.random.default_rng(20261201)
    all_cases = cases(rng)
    failures = 0
    for device in devices:
        lines = []
        for k, (bits, block, n, records, in_dtype, out_dtype, x) in enumerate(all_cases):
            path = os.path.join(args.workdir, f"case{k}")
            x.astype("<f4").tofile(path + ".in")
            lines.append(f"{bits} {block} {n} {records} {in_dtype} {out_dtype} {path}.in {path}.{device}")
        manifest = os.path.join(args.workdir, f"cases.{device}")
        with open(manifest, "w") as f:
            f.write("\n".join(lines) + "\n")
        run = subprocess.run([args.tool, "--device", device, "--cases", manifest], capture_output=True, text=True)
        if run.returncode != 0:
            print(f"FAIL {device}: amsp_quant_tool exited {run.returncode}: {run.stderr.strip()}")
            failures += 1
            continue
        bad = 0
        for k, (bits, block, n, records, in_dtype, out_dtype, x) in enumerate(all_cases):
            what = f"{device} case {k} (bits {bits} block {block} n {n} records {records} {in_dtype}->{out_dtype})"
            prefix = os.path.join(args.workdir, f"case{k}.{device}")
            raw, deq, total = reference(x, n, records, bits, block, out_dtype)
            assert len(raw) == records * record_bytes(n, bits, block)
            got = open(prefix + ".records", "rb").read()
            if got != raw:
                at = next((i for i in range(min(len(got), len(raw))) if got[i] != raw[i]), min(len(got), len(raw)))
                print(f"FAIL {what}: records differ from byte {at} of {len(raw)} (got {len(got)} bytes)")
                bad += 1
            for name, want in (("dequant", deq), ("sum", total)):
                got_v = np.fromfile(prefix + "." + name, "<f4").astype(F32)
                idx = same_bits(got_v, want) if got_v.size == want.size else [0]
                if len(idx):
                    i = idx[0]
                    print(f"FAIL {what}: {name} differs in {len(idx)} of {want.size} values; "
                          f"first [{i}]: got {got_v[i] if i < got_v.size else None!r} want {want[i]!r}")
                    bad += 1
        failures += bad
        print(f"{device}: {len(all_cases)} cases, {'all bit-identical to NumPy' if bad == 0 else f'{bad} outputs differ'}"
              f" ({run.stderr.strip()})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
