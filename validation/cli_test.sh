#!/usr/bin/env bash
# Bad input gets one clear line on stderr naming what is wrong, and exit code 2.
# usage: cli_test.sh AMSP_BINARY WORKDIR
set -u
amsp=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
cd "$work"
failures=0
passed=0

# expect_error NAME PATTERN -- COMMAND...: exit 2, exactly one stderr line matching PATTERN.
expect_error() {
  local name=$1 pattern=$2
  shift 3
  "$@" >out.txt 2>err.txt
  local rc=$?
  local lines
  lines=$(wc -l <err.txt)
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -Eq -- "$pattern" err.txt; then
    echo "FAIL $name: exit $rc, $lines stderr lines, expected /$pattern/:"
    sed 's/^/    /' err.txt | head -5
    failures=$((failures + 1))
  else
    echo "ok   $name: $(cat err.txt)"
    passed=$((passed + 1))
  fi
}

printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 1 400) >text.txt
printf 'short\n' >short.txt
"$amsp" data prepare --input text.txt --output good.h5 >/dev/null || { echo "FAIL: prepare"; exit 1; }
# JSON Lines, gzip-compressed, one bad record skipped.
printf '{"text": "fine"}\n{"title": "no text"}\n' >bad.jsonl
{ printf '{"text": "%s"}\n' one two three; echo '{"id": 4}'; } | gzip >docs.jsonl.gz
out=$("$amsp" data prepare --input docs.jsonl.gz --output jsonl.h5 --skip-bad-records --valid-fraction 0) ||
  { echo "FAIL: prepare of JSON Lines"; exit 1; }
case "$out" in *": 3 documents, 60 bytes -> 14 train"*"skipped 1 bad records"*) ;; *) echo "FAIL: prepare of JSON Lines said: $out"; exit 1 ;; esac
"$amsp" data prepare --input short.txt --output short.h5 --valid-fraction 0 >/dev/null || { echo "FAIL: prepare short"; exit 1; }
echo "this is not HDF5" >notdata.h5
h5mkgrp -p other.h5 /something >/dev/null 2>&1 || python3 -c "import h5py; h5py.File('other.h5','w').create_group('something')"

train=("$amsp" train --data good.h5 --steps 1 --eval-every 0 --batch-size 2 --seq-len 32 --peak-tflops 1)

expect_error "unknown command" "unknown command 'fly'" -- "$amsp" fly
expect_error "unknown option" "unknown option --stepz" -- "${train[@]}" --stepz 3
expect_error "bad integer" "--steps.*expected an integer" -- "$amsp" train --data good.h5 --steps abc
expect_error "bad number" "--lr.*expected a number" -- "$amsp" train --data good.h5 --lr fast
expect_error "negative steps" "--steps.*expected an integer >= 0" -- "${train[@]}" --steps -1
expect_error "bad checkpoint io" "--checkpoint-io parallel: expected independent or collective" -- "${train[@]}" --checkpoint-io parallel
expect_error "precision fp64" "--precision fp64: expected fp32 or bf16" -- "${train[@]}" --precision fp64
expect_error "run info dir" "--run-info nodir/run.json: no directory nodir" -- "${train[@]}" --run-info nodir/run.json
# Every file the run writes as it goes or at its end, refused before training.
for opt in metrics trace kernel-profile param-trace final-params data-order; do
  expect_error "$opt dir" "--$opt nodir/out: no directory nodir; expected a file in an existing directory" -- \
    "${train[@]}" --$opt nodir/out
done
expect_error "missing --data" "missing required option --data" -- "$amsp" train
expect_error "missing dataset" "--data nosuch.h5: no such file" -- "$amsp" train --data nosuch.h5
expect_error "malformed dataset" "--data notdata.h5: not an HDF5 file" -- "$amsp" train --data notdata.h5
expect_error "foreign HDF5" "format attribute" -- "$amsp" train --data other.h5
expect_error "dataset shorter than a sequence" "fewer than one sequence of --seq-len" -- \
  "$amsp" train --data short.h5 --seq-len 64 --steps 1
expect_error "dataset vocabulary beyond the model's" "its tokenizer has 256 ids but the model's vocab_size is 100" -- \
  "${train[@]}" --model.vocab_size 100
expect_error "heads not dividing hidden" "num_attention_heads = 3 does not divide hidden_size = 128" -- \
  "${train[@]}" --model.num_attention_heads 3
expect_error "kv heads not dividing heads" "num_key_value_heads = 3 does not divide num_attention_heads = 4" -- \
  "${train[@]}" --model.num_key_value_heads 3
expect_error "bad model field" "--model.hidden_size = 'wide': expected an integer" -- \
  "${train[@]}" --model.hidden_size wide
expect_error "unknown preset" "--model huge: no such preset; expected one of .*tiny" -- \
  "${train[@]}" --model huge
expect_error "seq-len beyond positions" "--seq-len 4096: expected at most max_position_embeddings" -- \
  "${train[@]}" --seq-len 4096
expect_error "uneven global batch" "--global-batch 100: not a whole number of sequences of 32 tokens on each of 1 ranks; the nearest that are: 96 or 128 tokens" -- \
  "${train[@]}" --global-batch 100
expect_error "global batch with grad-accum" "--global-batch and --grad-accum: give one" -- \
  "${train[@]}" --global-batch 64 --grad-accum 2
expect_error "compress auto with a fixed plan" "--compress auto: the planner chooses the compression only with --shard auto" -- \
  "${train[@]}" --compress auto --shard zero3
expect_error "bad compress guard" "--compress-guard always: expected warn, fallback or off" -- \
  "${train[@]}" --compress on --compress-guard always
expect_error "bad compress guard period" "--compress-guard-every 0: expected an integer >= 1" -- \
  "${train[@]}" --compress on --compress-guard-every 0
expect_error "profiler step on the CPU" "--cuda-profiler-step 2: the CPU backend has no device profiler; expected --device cuda" -- \
  "${train[@]}" --device cpu --cuda-profiler-step 2
expect_error "no reduction slot" "--reduction-slots 0: expected an integer >= 1" -- \
  "${train[@]}" --reduction-slots 0
expect_error "no prefetched unit" "--prefetch-units 0: expected an integer >= 1" -- \
  "${train[@]}" --prefetch-units 0
expect_error "negative profiler step" "--cuda-profiler-step -1: expected an integer >= 0" -- \
  "${train[@]}" --cuda-profiler-step -1
expect_error "missing input" "--input nosuch.txt: no such file, folder, or files matching it" -- \
  "$amsp" data prepare --input nosuch.txt --output x.h5
expect_error "bad input format" "--input-format csv: expected auto, text or jsonl" -- \
  "$amsp" data prepare --input text.txt --output x.h5 --input-format csv
expect_error "bad JSON Lines record" "--input bad.jsonl:2: no \"text\" field" -- \
  "$amsp" data prepare --input bad.jsonl --output x.h5
expect_error "missing output dir" "--output" -- \
  "$amsp" data prepare --input text.txt --output nodir/x.h5
expect_error "bad valid fraction" "--valid-fraction.*expected a number in \[0, 0.5\]" -- \
  "$amsp" data prepare --input text.txt --output x.h5 --valid-fraction 0.9
expect_error "missing sentencepiece model" "--tokenizer" -- \
  "$amsp" data prepare --input text.txt --output x.h5 --tokenizer nosuch.model
expect_error "missing config" "--config nosuch.ini: no such file" -- "$amsp" train --config nosuch.ini
printf 'steps = many\n' >bad.ini
expect_error "bad config value" "--config bad.ini: option 'steps' has a bad value; expected an integer" -- \
  "$amsp" train --config bad.ini --data good.h5
printf 'stepz = 3\n' >unknown.ini
expect_error "unknown config key" "--config unknown.ini: unknown option 'stepz'" -- \
  "$amsp" train --config unknown.ini --data good.h5

# The config file supplies options; the command line wins over it.
printf 'data = good.h5\nsteps = 3\neval-every = 0\nbatch-size = 2\nseq-len = 32\npeak-tflops = 1\n[model]\nnum_hidden_layers = 1\n' >good.ini
if "$amsp" train --config good.ini --steps 2 --metrics m.jsonl >out.txt 2>err.txt &&
   [ "$(grep -c '"step_ms"' m.jsonl)" -eq 2 ] && grep -q "num_hidden_layers.*| 1 " out.txt; then
  echo "ok   config file with command-line override"; passed=$((passed + 1))
else
  echo "FAIL config file with command-line override"; cat err.txt; failures=$((failures + 1))
fi

# Nothing half-written is left behind by a failed prepare.
if ls x.h5* >/dev/null 2>&1; then echo "FAIL: failed prepare left $(ls x.h5*)"; failures=$((failures + 1));
else echo "ok   failed prepare leaves no file"; passed=$((passed + 1)); fi

# Every command's help prints its defaults as written (0.1, not 0.10000000000000001).
for cmd in train plan eval comm-bench "data prepare"; do
  # shellcheck disable=SC2086
  noisy=$("$amsp" $cmd --help 2>&1 | grep -E '\(=[0-9]*\.[0-9]{8,}') || true
  if [ -n "$noisy" ]; then echo "FAIL $cmd --help prints a default with float noise: $noisy"; failures=$((failures + 1));
  else echo "ok   $cmd --help: defaults as written"; passed=$((passed + 1)); fi
done

echo "$passed passed, $failures failed"
[ "$failures" -eq 0 ]
