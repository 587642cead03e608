#!/usr/bin/env bash
# Fails if a fused multiply-add instruction is in the machine code of the
# quantization kernels, CPU (kernels/cpu/quant.cpp, compiled with
# -ffp-contract=off) and CUDA under emulation (kernels/cuda/quant.cu through its
# emu wrapper): dequantize_sum must round every product and every addition on
# its own (doc/compression.md).
#
#   usage: no_fma.sh OBJECT...   (the objects of the libraries; those named
#                                 quant.cpp.o are checked, and there must be two)
set -uo pipefail

objects=()
for o in "$@"; do
  [[ $(basename "$o") == quant.cpp.o ]] && objects+=("$o")
done
if ((${#objects[@]} != 2)); then
  echo "no_fma.sh: expected the two quant.cpp.o objects among the arguments, found ${#objects[@]}" >&2
  exit 1
fi
status=0
for o in "${objects[@]}"; do
  asm=$(objdump -d --no-show-raw-insn "$o") || { echo "no_fma.sh: objdump failed on $o" >&2; exit 1; }
  # The disassembly must hold the kernels, or finding nothing proves nothing.
  if ! grep -q "dequantize_sum" <<<"$asm"; then
    echo "no_fma.sh: $o holds no dequantize_sum" >&2
    exit 1
  fi
  fused=$(grep -Ec '\bv?f(n)?m(add|sub|addsub|subadd)[0-9]{3}[sp][sd]\b' <<<"$asm")
  instructions=$(grep -Ec '^\s+[0-9a-f]+:' <<<"$asm")
  if ((fused > 0)); then
    echo "FAIL $o: $fused fused multiply-add instructions among $instructions:"
    grep -E '\bv?f(n)?m(add|sub|addsub|subadd)[0-9]{3}[sp][sd]\b' <<<"$asm" | head -5
    status=1
  else
    echo "ok $o: no fused multiply-add among $instructions instructions"
  fi
done
exit $status
