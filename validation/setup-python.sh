#!/usr/bin/env bash
# Sets up the Python environment for the Hugging Face comparison
# (validation/hf_compare.py) and the PyTorch benchmark
# (benchmarks/torch_side_by_side.py), then prints the path of its python
# interpreter as the last (and, on success, only) line of standard output:
#
#   PY=$(validation/setup-python.sh) && "$PY" validation/hf_compare.py ...
#
# What it installs (Debian 12 "bookworm"; run as root, or have it done already):
#   - Debian's CPU-only PyTorch and friends (apt): python3-torch (1.13.1),
#     python3-numpy, python3-h5py, python3-venv, libopenblas0-openmp. PyTorch
#     from PyPI would pull gigabytes of CUDA wheels; Debian's build is CPU only.
#   - a venv on Debian's /usr/bin/python3 (3.11) with --system-site-packages,
#     so that it sees the Debian packages, at $AMSP_PYENV
#     (default /var/cache/amsp/pyenv), holding the pinned PyPI packages below.
#
# Idempotent and fast on re-run: when the Debian packages are installed and the
# venv's stamp matches the pinned list, it only checks the imports and prints
# the path. Set AMSP_PYENV to put the venv elsewhere. Progress and errors go to
# standard error; on failure it exits non-zero with a one-line reason.
set -euo pipefail

# transformers 4.44.2 is the newest release checked to work with Debian's
# torch 1.13 (LlamaForCausalLM, eager attention, forward and backward); its own
# metadata asks nothing of torch's version. The rest are its dependencies, pinned
# to releases of the same time so that the environment is reproducible.
# sentencepiece (a manylinux wheel for CPython 3.11) trains the SentencePiece model
# of hf_export_test.py and backs transformers' LlamaTokenizer; protobuf is what
# transformers needs to convert that model into LlamaTokenizerFast (AutoTokenizer).
PIP_PINS=(
  transformers==4.44.2
  tokenizers==0.19.1
  safetensors==0.4.5
  huggingface-hub==0.24.6
  filelock==3.15.4
  fsspec==2024.6.1
  packaging==24.1
  regex==2024.7.24
  tqdm==4.66.5
  sentencepiece==0.2.0
  protobuf==4.25.4
)
# libopenblas0-openmp: torch's BLAS is whatever provides libblas.so.3; without it
# apt (with --no-install-recommends) would pick the slow reference libblas3.
APT_PACKAGES=(python3-torch python3-numpy python3-h5py python3-venv libopenblas0-openmp)
SYSTEM_PYTHON=/usr/bin/python3

PYENV=${AMSP_PYENV:-/var/cache/amsp/pyenv}
VENV_PY="$PYENV/bin/python"
STAMP="$PYENV/.amsp-stamp"
LOG=$(mktemp -t amsp-setup-python.XXXXXX)
trap 'rm -f "$LOG"' EXIT

die() {
  echo "setup-python.sh: $*" >&2
  exit 1
}

# Runs a command with its output kept aside; on failure shows the tail of it.
quiet() {
  if ! "$@" >"$LOG" 2>&1; then
    tail -n 30 "$LOG" >&2
    die "failed: $*"
  fi
}

check_imports() {
  "$1" - <<'EOF'
import sys
import h5py, numpy, torch, transformers
import sentencepiece, google.protobuf  # noqa: F401
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401
assert sys.version_info[:2] >= (3, 9), sys.version
EOF
}

# One run at a time (CTest may start two users of the environment at once).
mkdir -p "$(dirname "$PYENV")" 2>/dev/null || die "cannot create $(dirname "$PYENV"); set AMSP_PYENV to a writable path"
exec 9>"$PYENV.lock" || die "cannot write $PYENV.lock; set AMSP_PYENV to a writable path"
flock 9 || die "cannot lock $PYENV.lock"

# --- Debian packages ----------------------------------------------------------
missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    die "Debian packages missing: ${missing[*]}; run this script as root or 'apt-get install -y ${missing[*]}'"
  fi
  command -v apt-get >/dev/null || die "apt-get not found: this script expects Debian 12 (bookworm)"
  echo "setup-python.sh: installing ${missing[*]} (apt)" >&2
  quiet apt-get update -q
  quiet env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
[[ -x $SYSTEM_PYTHON ]] || die "$SYSTEM_PYTHON not found"

# --- the venv -----------------------------------------------------------------
want_stamp="$(printf '%s\n' "${PIP_PINS[@]}")"
if [[ -x $VENV_PY && -f $STAMP && "$(cat "$STAMP")" == "$want_stamp" ]]; then
  if check_imports "$VENV_PY" >"$LOG" 2>&1; then
    echo "$VENV_PY"
    exit 0
  fi
  echo "setup-python.sh: $PYENV is broken, rebuilding it" >&2
fi

echo "setup-python.sh: creating $PYENV (pip: ${PIP_PINS[*]})" >&2
rm -f "$STAMP"
quiet "$SYSTEM_PYTHON" -m venv --system-site-packages --clear "$PYENV"
quiet env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV_PY" -m pip install --no-input -q "${PIP_PINS[@]}"
if ! check_imports "$VENV_PY" >"$LOG" 2>&1; then
  tail -n 30 "$LOG" >&2
  die "the environment at $PYENV does not import torch/transformers/h5py"
fi
printf '%s\n' "$want_stamp" >"$STAMP"
echo "$VENV_PY"
