#!/usr/bin/env bash
# The README's second example, end to end: JSON Lines shards and a tokenizer.json
# made here (inputs/corpus/make_jsonl.py, with the pinned tokenizers of
# setup-python.sh), tokenized by amsp data prepare on 2 ranks, then 60 steps of the
# tiny preset with the tokenizer's vocabulary on 2 ranks: the validation loss must
# fall well below the uniform guess's ln(4096) = 8.32.
# usage: real_corpus_example.sh AMSP MPIEXEC WORKDIR
set -euo pipefail
amsp=$1 mpiexec=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
PY=$("$here/setup-python.sh")
"$PY" "$here/../inputs/corpus/make_jsonl.py" "$work/real"
"$mpiexec" -n 2 "$amsp" data prepare --input "$work/real/shards/*.jsonl.gz" \
  --tokenizer "$work/real/tokenizer.json" --output "$work/real.h5"
"$mpiexec" -n 2 "$amsp" train --data "$work/real.h5" --model.vocab_size 4096 --batch-size 4 --threads 1 \
  --steps 60 --eval-every 60 | tee "$work/train.log"
loss=$(sed -n 's/^eval step 60 | val loss \([0-9.]*\).*/\1/p' "$work/train.log")
[[ -n $loss ]] || { echo "real_corpus_example: no validation loss at step 60"; exit 1; }
if ! awk -v l="$loss" 'BEGIN { exit !(l < 7.3) }'; then
  echo "real_corpus_example: validation loss $loss after 60 steps; expected below 7.3"
  exit 1
fi
echo "real_corpus_example: ok (validation loss $loss after 60 steps, from ln(4096) = 8.32)"
