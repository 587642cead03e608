#!/usr/bin/env bash
# amsp ckpt inspect / verify on a checkpoint written by 2 MPI ranks, a flipped
# byte caught by verify (exit 1, dataset named), and the file read by h5dump
# and by h5py (Debian's python3-h5py) with no amsp code.
#
#   cli_test.sh AMSP_CKPT_TEST AMSP MPIEXEC WORKDIR
set -euo pipefail
ckpt_test=$1 amsp=$2 mpiexec=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$mpiexec" -n 2 "$ckpt_test" "$work" > "$work/write.log" 2>&1 || { cat "$work/write.log"; fail "writing the test checkpoints"; }
f="$work/n2/keep/step-00000004.h5"
[ -f "$f" ] || fail "no checkpoint at $f"

"$amsp" ckpt inspect "$f" > "$work/inspect.txt" || fail "inspect exited $?"
for want in "step            4" "tokens          4000" "world size      2" "plan            " \
            "model/layers.1.mlp.down_proj.weight" "optimizer/exp_avg_sq/lm_head.weight" "[104, 40]" "float32"; do
  grep -qF -- "$want" "$work/inspect.txt" || { cat "$work/inspect.txt"; fail "inspect does not show '$want'"; }
done
"$amsp" ckpt verify "$f" > "$work/verify.txt" || fail "verify of an intact checkpoint exited $?"
grep -q "ok, 63 datasets verified" "$work/verify.txt" || fail "verify: $(cat "$work/verify.txt")"

# Flip one byte inside a dataset's data (offset from h5dump's storage layout).
name=/model/layers.1.mlp.down_proj.weight
offset=$(h5dump -p -H -d "$name" "$f" | awk '/OFFSET/ {print $2; exit}')
[ -n "$offset" ] || fail "h5dump gave no offset for $name"
cp "$f" "$work/damaged.h5"
byte=$(dd if="$work/damaged.h5" bs=1 skip=$((offset + 101)) count=1 2>/dev/null | od -An -tu1 | tr -d ' ')
printf "$(printf '\\%03o' $(( (byte ^ 8) & 255 )))" |
  dd of="$work/damaged.h5" bs=1 seek=$((offset + 101)) count=1 conv=notrunc 2>/dev/null
set +e
"$amsp" ckpt verify "$work/damaged.h5" > "$work/damaged.out" 2> "$work/damaged.err"
rc=$?
set -e
[ "$rc" = 1 ] || fail "verify of a damaged checkpoint exited $rc, expected 1"
grep -q "dataset model/layers.1.mlp.down_proj.weight fails its checksum" "$work/damaged.err" ||
  fail "verify does not name the damaged dataset: $(cat "$work/damaged.err")"
[ "$(grep -c 'fails its checksum' "$work/damaged.err")" = 1 ] || fail "verify blames other datasets too"
set +e
"$amsp" ckpt verify "$work/missing.h5" 2> "$work/missing.err"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "no such file" "$work/missing.err" || fail "verify of a missing file: rc $rc"

# h5dump reads it with no help.
h5dump -d /model/norm.weight -A "$f" > "$work/h5dump.txt" || fail "h5dump cannot read the file"
grep -q 'ATTRIBUTE "checksum"' "$work/h5dump.txt" || fail "h5dump shows no checksum attribute"
h5dump -a /step "$f" | grep -q "(0): 4" || fail "h5dump does not show step 4"

# h5py (Debian's python3-h5py, which .ci/packages installs): a missing h5py is a
# failure, not a skip, so that this check cannot silently stop running.
/usr/bin/python3 -c "import h5py, numpy" 2>/dev/null || fail "h5py is not installed (apt-get install python3-h5py)"
/usr/bin/python3 "$here/h5py_check.py" "$f" || fail "h5py check"
echo "ckpt cli: all passed"
