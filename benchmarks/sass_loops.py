#!/usr/bin/env python3
"""What a tensor-core kernel's inner loops ask of an SM, read from its machine code, beside
another commit's: a measure for where no GPU runs.

Compiles a kernel source (default kernels/cuda/attention_bf16.cu) for sm_90 with nvcc, as
it is in the tree and as it was at --base (a commit: its kernels/ folder from git), and
prints per selected kernel its registers and stack (cuobjdump -res-usage) and, for each
loop of its SASS that holds tensor-core products (a backward branch's range holding HMMA
instructions, innermost first), the instructions per iteration, the products (HMMA), the
special-function ops (MUFU: ex2 and friends) and the instructions per product.

The last figure is what the tensor cores wait on when a kernel cannot issue fast enough:
a warp's SM sub-partition issues one instruction a cycle, and an m16n8k16 product keeps
its tensor core busy for a few cycles, so a loop far above a few instructions per product
is bound by issue, not by the tensor cores. These are static counts of one loop body
(both sides of a branch inside it count), a model, not a GPU's time; doc/gpu.md keeps
the two apart. Loops without products inside a product loop (a tile's copies, say) are
listed by size: they run several times an iteration, which a static count cannot know;
doc/gpu.md weighs them by their trip counts.

Needs nvcc (the CUDA toolkit) and cuobjdump (the toolkit's, or `pip install
nvidia-cuda-cuobjdump`). A benchmark: it never fails on a figure.

usage: benchmarks/sass_loops.py [--base REV] [--source FILE] [--kernels SUBSTR,...]
           [--arch sm_90]
"""

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The kernels of llama-1b's step at D = 64 with bf16 activations (the GPU check's shape).
DEFAULT_KERNELS = ("forward_bf16_kernelINS2_3FwdILi64EtLi2E", "dq_bf16_kernelINS2_3FwdILi64EtLi2E",
                   "dkv_bf16_kernelINS2_3DkvILi64EtLi32ELi2E")


def tool(name):
    """A CUDA tool from PATH, the toolkit, or the pip wheel's nvidia/cu*/bin."""
    found = shutil.which(name) or (f"/usr/local/cuda/bin/{name}"
                                   if os.access(f"/usr/local/cuda/bin/{name}", os.X_OK) else None)
    if not found:
        wheels = glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "cu*", "bin", name))
        found = wheels[0] if wheels else None
    if not found:
        sys.exit(f"sass_loops.py: no {name} (install the CUDA toolkit"
                 + (", or `pip install nvidia-cuda-cuobjdump`)" if name == "cuobjdump" else ")"))
    return found


def compile_cubin(root, source, arch, out):
    cmd = [tool("nvcc"), "-std=c++17", f"-arch={arch}", "--expt-relaxed-constexpr", "-DAMSP_CUDA_REAL",
           f"-I{root}", "-cubin", os.path.join(root, source), "-o", out]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"sass_loops.py: nvcc failed on {source} in {root}:\n{done.stderr[-2000:]}")


def functions(cubin):
    """{mangled name: (SASS text, resources line)}."""
    sass = subprocess.run([tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True).stdout
    res = subprocess.run([tool("cuobjdump"), "-res-usage", cubin], capture_output=True, text=True).stdout
    usage = dict(re.findall(r"Function (\S+):\s*\n\s*(REG:.*)", res))
    out = {}
    for body in re.split(r"\n\s*Function : ", sass)[1:]:
        name = body.split("\n", 1)[0].strip()
        out[name] = (body, usage.get(name, ""))
    return out


def instructions(body):
    """[(address, opcode, text)] of a function's SASS, predicates dropped from the opcode."""
    return [(int(a, 16), op.split(".")[0], text) for a, text, op in
            re.findall(r"/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)[^;]*);", body)]


def loops_of(code):
    """[(first, last address, Counter of opcodes)] of every loop (a backward branch's range)."""
    loops = []
    for addr, op, text in code:
        target = re.search(r"0x([0-9a-f]+)", text) if op == "BRA" else None
        if target and int(target.group(1), 16) <= addr:
            lo = int(target.group(1), 16)
            loops.append((lo, addr, collections.Counter(o for a, o, _ in code if lo <= a <= addr)))
    return loops


def product_loops(body):
    """(instructions, Counter, [sizes of the loops without products inside it]) for each
    loop holding HMMA, innermost first. The inner loops (copies, conversions) run several
    times an iteration: the static count holds each body once."""
    loops = loops_of(instructions(body))
    out = []
    for lo, hi, ops in loops:
        if ops["HMMA"]:
            inner = [sum(o.values()) for l2, h2, o in loops
                     if lo <= l2 and h2 <= hi and (l2, h2) != (lo, hi) and not o["HMMA"]]
            out.append((sum(ops.values()), ops, inner))
    return sorted(out, key=lambda x: x[0])


def short(name):
    name = re.sub(r".*_cu_\w{8}\d*", "", name)
    return re.sub(r"EEEEvPK.*", "", name)


def report(label, funcs, wanted):
    print(f"\n{label}")
    for name, (body, usage) in funcs.items():
        if not any(w in name for w in wanted):
            continue
        reg = re.search(r"REG:(\d+)", usage)
        stack = re.search(r"STACK:(\d+)", usage)
        print(f"  {short(name)}: {reg.group(1) if reg else '?'} registers, "
              f"{stack.group(1) if stack else '?'} bytes of stack")
        for n, ops, inner in product_loops(body)[:2]:
            print(f"    loop: {n:5d} instructions, HMMA {ops['HMMA']:3d}, MUFU {ops['MUFU']:3d}, "
                  f"LDSM {ops['LDSM']:3d}: {n / ops['HMMA']:5.1f} per product"
                  + (f"; inside it, loops without products of {', '.join(map(str, inner))} "
                     "instructions, counted once" if inner else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="a commit to compare against (its kernels/ folder)")
    ap.add_argument("--source", default="kernels/cuda/attention_bf16.cu")
    ap.add_argument("--kernels", default=",".join(DEFAULT_KERNELS),
                    help="substrings of the mangled kernel names to report")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    wanted = [k for k in args.kernels.split(",") if k]
    with tempfile.TemporaryDirectory() as tmp:
        sides = []
        if args.base:
            base_root = os.path.join(tmp, "base")
            os.makedirs(base_root)
            archive = subprocess.run(["git", "-C", REPO, "archive", args.base, "kernels"],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", base_root], input=archive, check=True)
            sides.append((f"{args.base} ({args.source}, {args.arch})", base_root))
        sides.append((f"this tree ({args.source}, {args.arch})", REPO))
        for i, (label, root) in enumerate(sides):
            cubin = os.path.join(tmp, f"{i}.cubin")
            compile_cubin(root, args.source, args.arch, cubin)
            report(label, functions(cubin), wanted)


if __name__ == "__main__":
    main()
