#!/usr/bin/env bash
# The GPU bundle (validation/gpu/bundle.sh) used as a bare GPU machine would use it,
# minus the GPU:
#   - the archive is at most 48 MiB, and built for sm_80 and sm_90;
#   - unpacked into an empty folder, in a mount namespace where every library the
#     bundle packs is hidden at the place it was packed from (/dev/null mounted
#     over it), ldd resolves each packed library inside the bundle, and amsp's CPU
#     path runs: its version, a CPU backend-check, and two ranks training the tiny
#     preset through the bundle's own MPICH launcher;
#   - without a driver, gpu-info says so on one line and exits non-zero;
#   - the benchmarks the check runs on the CPU cores run from the bundle's tree;
#   - on a machine whose glibc is older than the bundle needs, the programs run on
#     the packed loader and glibc.
#
#   bundle_test.sh ARCHIVE WORKDIR CORPUS.h5      (as root: unshare -m)
set -euo pipefail
archive=$1 work=$2 corpus=$3
max=$((48 * 1024 * 1024))
bytes=$(stat -c %s "$archive")
echo "archive: $((bytes / 1048576)) MiB ($bytes bytes, limit $max)"
((bytes <= max)) || { echo "FAIL: the archive is over 48 MiB"; exit 1; }

rm -rf "$work" && mkdir -p "$work"
tar -C "$work" -xJf "$archive"
b=$work/amsp-gpu
[[ -f $b/MANIFEST ]] || { echo "FAIL: no MANIFEST in the archive"; exit 1; }
grep -q '^cuda .* arch 80;90$' "$b/MANIFEST" ||
  { echo "FAIL: the MANIFEST does not name both architectures (sm_80 and sm_90): $(grep '^cuda' "$b/MANIFEST")"; exit 1; }
cp "$corpus" "$work/corpus.h5"

# Inside the namespace: the packed libraries' origins hidden, then the checks.
inner=$(cat <<'INNER'
set -euo pipefail
b=$1 work=$2
hidden=0
while read -r kind name path; do
  [[ $kind == lib ]] || continue
  real=$(readlink -f "$path")
  mount --bind /dev/null "$real"
  hidden=$((hidden + 1))
done < "$b/MANIFEST"
echo "hidden: $hidden packed libraries at their origins"
here=$b
. "$b/libexec/cuda-libs.sh" 2>"$work/finder.txt" || { cat "$work/finder.txt"; exit 1; }
cat "$work/finder.txt"
grep -q '^amsp bundle: CUDA libraries: .*libcublas' "$work/finder.txt" || { echo "FAIL: no CUDA library line"; exit 1; }
outside=0
for elf in "$b"/libexec/amsp "$b"/libexec/mpiexec.hydra "$b"/libexec/hydra_pmi_proxy.bin; do
  while read -r name arrow path rest; do
    if [[ $name == FAIL:* || "$name $arrow $path $rest" == *"not found"* || "$name $arrow $path $rest" == *error* ]]; then
      echo "FAIL: $(basename "$elf"): $name $arrow $path $rest"; outside=1; continue
    fi
    [[ $arrow == "=>" ]] || continue
    if grep -q "^lib $name " "$b/MANIFEST" && [[ $(readlink -f "$path") != "$b/lib/$name" ]]; then
      echo "FAIL: $(basename "$elf") loads $name from $path, not from the bundle"; outside=1
    fi
  done < <(ldd "$elf" 2>&1 || echo "FAIL: ldd $(basename "$elf") failed")
done
((outside == 0)) || exit 1
echo "ldd: every packed library resolves inside the bundle"
"$b/bin/amsp" --version
"$b/bin/amsp" backend-check --device cpu --precision bf16 | tail -1
"$b/bin/mpiexec" -launcher fork -n 2 "$b/bin/amsp" train --device cpu --model tiny --data "$work/corpus.h5" \
    --steps 3 --batch-size 2 --seq-len 32 --shard zero3 --eval-every 0 --threads 1 --metrics "$work/m.jsonl" >"$work/train.log" 2>&1 \
  || { tail -5 "$work/train.log"; echo "FAIL: two ranks through the bundle's mpiexec"; exit 1; }
[[ $(grep -c '"loss"' "$work/m.jsonl") == 3 ]] || { echo "FAIL: expected 3 steps in $work/m.jsonl"; exit 1; }
echo "train: 2 ranks, 3 steps through the bundle's mpiexec"
set +e
"$b/bin/amsp" gpu-info >"$work/gpu-info.txt" 2>&1
rc=$?
set -e
lines=$(grep -c . "$work/gpu-info.txt" || true)
cat "$work/gpu-info.txt"
if ((rc == 0 || rc >= 128)) || ((lines != 1)); then
  echo "FAIL: gpu-info without a GPU: exit $rc and $lines lines (expected one line and a non-zero exit)"; exit 1
fi
INNER
)
unshare -m bash -c "$inner" inner "$b" "$work"

# The benchmarks the GPU check runs on the CPU cores, from the bundle's own tree of
# scripts and its programs, at tiny sizes: checkpoints written and read through the
# packed parallel HDF5, and every step's communication figures. (Outside the namespace:
# Python needs some of the libraries hidden there.)
tree=$b/share/amsp/tree/benchmarks
python3 "$tree/ckpt_stall.py" --amsp "$b/bin/amsp" --mpiexec "$b/bin/mpiexec" --data "$work/corpus.h5" \
    --model tiny --ranks 2 --steps 6 --every 2 --seq-len 32 --work "$work/stall" --json "$work/stall.json" \
    >"$work/stall.log" 2>&1 || { tail -5 "$work/stall.log"; echo "FAIL: the bundle's checkpoint benchmark"; exit 1; }
python3 "$tree/hidden_bench.py" --after "$b/bin/amsp" --mpiexec "$b/bin/mpiexec" --data "$work/corpus.h5" \
    --layouts mpi4 --plans zero3 --model tiny --seq-len 32 --steps 3 --warmup 1 --repeats 1 --work "$work/hidden" \
    --json "$work/hidden.json" >"$work/hidden.log" 2>&1 || { tail -5 "$work/hidden.log"; echo "FAIL: the bundle's hidden-communication benchmark"; exit 1; }
python3 - "$work/stall.json" "$work/hidden.json" <<'PY' || exit 1
import json, sys
stall, hidden = (json.load(open(p)) for p in sys.argv[1:])
ok = [s["step"] for s in stall["saves"]] == [2, 4, 6] and [r["plan"] for r in hidden] == ["zero3"] \
    and hidden[0]["comm_ms"] > 0
sys.exit(0 if ok else f"FAIL: the bundle's benchmarks' figures: saves {[s['step'] for s in stall['saves']]}, {hidden}")
PY
echo "benchmarks: the checkpoint stall and the hidden communication from the bundle's tree"

# An old glibc, as the wrappers see it (the bundle's need raised past this
# machine's): the programs run through the packed loader and glibc, one line says
# so, and two ranks still train through the bundle's launcher.
cp -r "$b" "$work/old"
sed -i 's/^glibc .*/glibc 9.99/' "$work/old/MANIFEST"
"$work/old/bin/mpiexec" -launcher fork -n 2 "$work/old/bin/amsp" train --device cpu --model tiny \
    --data "$work/corpus.h5" --steps 2 --batch-size 2 --seq-len 32 --eval-every 0 --threads 1 \
    --metrics "$work/old.jsonl" >"$work/old.log" 2>&1 || { tail -5 "$work/old.log"; echo "FAIL: the packed glibc"; exit 1; }
grep -q "^amsp bundle: this machine's glibc is .*, the bundle's programs need 9.99: running them with the bundle's own glibc" "$work/old.log" \
  || { echo "FAIL: no line saying the bundle's glibc is used"; exit 1; }
[[ $(grep -c '"loss"' "$work/old.jsonl") == 2 ]] || { echo "FAIL: the packed glibc: expected 2 steps"; exit 1; }
# And the program really ran on the packed loader: the loader's own trace names the
# libc it initialised.
LD_DEBUG=libs "$work/old/bin/amsp" --version >"$work/old-ld.log" 2>&1 || { echo "FAIL: --version on the packed glibc"; exit 1; }
grep -q "calling init: $work/old/lib/glibc/libc.so.6" "$work/old-ld.log" || { echo "FAIL: amsp did not load the packed libc"; exit 1; }
echo "old glibc: two ranks trained on the bundle's own loader and glibc"
echo "bundle: all checks passed"
