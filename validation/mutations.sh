#!/usr/bin/env bash
# Proves that the step-by-step PyTorch check (validation/train_compare.py) bites:
# plants one bug at a time in a copy of the source tree, rebuilds amsp there, and
# runs the check, which must fail for every bug. The bugs are ones a training loop
# really gets wrong; each is an exact text replacement that must apply (a stale
# pattern is an error, never a silent pass). doc/validation.md lists the results.
#
#   validation/mutations.sh [WORKDIR]      (default: build/mutations)
#
# Needs the corpus the test suite prepares (build/test-work/corpus.h5) or
# AMSP_CORPUS, and the Python environment of validation/setup-python.sh. Prints one
# line per mutation and ends with "N passed, M failed": a mutation passes when the
# check catches it. About 3 minutes on 2 cores after the suite's build (one build
# through its ccache, then one object file and a link per mutation).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(realpath -m "${1:-$repo/build/mutations}")
corpus=${AMSP_CORPUS:-$repo/build/test-work/corpus.h5}
[ -f "$corpus" ] || { echo "mutations.sh: no corpus at $corpus; run the test suite or set AMSP_CORPUS" >&2; exit 2; }
PY=$("$repo/validation/setup-python.sh")
if [ -z "${AMSP_CCACHE_DIR:-}" ] && [ -d "$repo/build/ccache" ]; then AMSP_CCACHE_DIR=$repo/build/ccache; fi

# Four words per mutation: name, file, text to find, replacement.
mutations=(
  "weight decay on RMSNorm weights and the embedding" src/engine/optimizer.cpp
  "if ((tensor.is_norm || tensor.is_embedding) && !options.decay_norms_and_embeddings) return 0.0;"
  "(void)tensor;"
  "warmup one step late (step / warmup instead of (step + 1) / warmup)" src/engine/schedule.h
  "s.lr * static_cast<double>(step + 1) / s.warmup_steps"
  "s.lr * static_cast<double>(step) / s.warmup_steps"
  "cosine decay that never reaches min_lr (decay_steps instead of decay_steps - 1)" src/engine/schedule.h
  "/ (decay_steps - 1), 0.0, 1.0)"
  "/ decay_steps, 0.0, 1.0)"
  "gradient clipping disabled" src/engine/sharded_engine.cpp
  "static_cast<float>(clip_scale));"
  "1.0f);"
  "Adam bias correction off by one (beta1^(step+1))" src/engine/optimizer.cpp
  "std::pow(options.beta1, static_cast<double>(step))"
  "std::pow(options.beta1, static_cast<double>(step + 1))"
)

# The copy is the work directory itself and builds in its build/, as the tree
# does: with the suite's ccache (AMSP_CCACHE_DIR, set by CTest) only the files a
# mutation changes are compiled.
src="$work"
echo "copying the tree to $src and building amsp there"
if [ -e "$work" ] && [ ! -f "$work/.amsp-mutations" ] && [ -n "$(ls -A "$work")" ]; then
  echo "mutations.sh: $work is not empty and not a mutations directory; expected a new or earlier WORKDIR" >&2
  exit 2
fi
rm -rf "$work"
mkdir -p "$work/logs"
touch "$work/.amsp-mutations"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$src"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DAMSP_TESTS=OFF -DAMSP_BENCHMARKS=OFF \
  ${AMSP_CCACHE_DIR:+-DAMSP_CCACHE_DIR="$AMSP_CCACHE_DIR"} >/dev/null
cmake --build "$work/build" -j"$(nproc)" --target amsp >/dev/null

replace() {  # file find repl: exactly one occurrence, or fail
  "$PY" - "$1" "$2" "$3" <<'EOF'
import sys
path, find, repl = sys.argv[1:4]
text = open(path).read()
n = text.count(find)
if n != 1:
    sys.exit(f"mutations.sh: {find!r} occurs {n} times in {path}; expected exactly once")
open(path, "w").write(text.replace(find, repl))
EOF
}

caught=0 missed=0
for ((i = 0; i < ${#mutations[@]}; i += 4)); do
  name=${mutations[i]} file=${mutations[i + 1]} find=${mutations[i + 2]} repl=${mutations[i + 3]}
  cp "$src/$file" "$work/logs/original"
  replace "$src/$file" "$find" "$repl"
  cmake --build "$work/build" -j"$(nproc)" --target amsp >/dev/null
  log="$work/logs/$(echo "$name" | tr -c 'a-zA-Z0-9' '_' | cut -c1-40).log"
  if "$PY" "$repo/validation/train_compare.py" --amsp "$work/build/amsp" --data "$corpus" \
       --workdir "$work/logs/run" --mpiexec "${MPIEXEC:-mpiexec}" \
       --only tiny-1rank-M3 --only tiny-4ranks-mixed-M3 >"$log" 2>&1; then
    echo "FAIL not caught: $name (log: $log)"
    missed=$((missed + 1))
  else
    echo "ok   caught: $name: $(grep -m1 '^FAIL' "$log" | cut -c1-200)"
    caught=$((caught + 1))
  fi
  cp "$work/logs/original" "$src/$file"
done
cmake --build "$work/build" -j"$(nproc)" --target amsp >/dev/null
echo "mutations: $caught passed, $missed failed"
[ "$missed" -eq 0 ]
