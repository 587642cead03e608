#!/usr/bin/env bash
# amsp gpu-info on the CPU emulation of CUDA: every line present and the JSON
# beside it; a driver too old for the runtime (the emulated driver told to
# report CUDA 12.4) refused in one line with exit 1; a GPU that is not there
# refused in one line with exit 2.
# usage: gpu_info_test.sh AMSP_BINARY WORKDIR
set -u
amsp=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
cd "$work"
export AMSP_CUDA_EMULATION=1 AMSP_EMU_DEVICES=2
failures=0

check() {  # check NAME CONDITION...: one line per check, the output on failure
  local name=$1
  shift
  if "$@"; then
    echo "ok   $name"
  else
    echo "FAIL $name"; sed 's/^/    /' out.txt err.txt | head -20
    failures=$((failures + 1))
  fi
}

"$amsp" gpu-info --json info.json >out.txt 2>err.txt
rc=$?
check "exit 0" test "$rc" -eq 0
check "says it is the emulation" grep -q "^gpu-info: the CPU emulation of CUDA" out.txt
for key in "driver:   emulated, supports CUDA 13.0" "runtime:  CUDA 13.0, emulated, in /" "cublas:   13.0.0, emulated" \
           "cudnn:    " "nccl:     2.28.0, emulated" "gpu 0:    emulated CUDA device (CPU), sm_80" "gpu 1:    "; do
  check "line '$key'" grep -q "^$key" out.txt
done
check "no third GPU" bash -c '! grep -q "^gpu 2:" out.txt'
check "json" python3 -c '
import json, sys
j = json.load(open("info.json"))
assert j["emulated"] is True and j["ok"] is True and j["error"] is None, j
assert j["driver"]["cuda_code"] == 13000 and j["runtime"]["code"] == 13000, j
assert j["runtime"]["static"] is True and j["nccl"]["version"] == "2.28.0", j
assert [g["index"] for g in j["gpus"]] == [0, 1] and j["gpus"][0]["sm"] == "sm_80", j
assert "found" in j["cudnn"] and j["cudnn"]["used_by_this_build"] is False, j
'

AMSP_EMU_DRIVER_CUDA_VERSION=12040 "$amsp" gpu-info --json old.json >out.txt 2>err.txt
rc=$?
check "old driver: exit 1" test "$rc" -eq 1
check "old driver: one line" test "$(cat out.txt err.txt | wc -l)" -eq 1
check "old driver: the refusal" grep -qx "amsp: error: the driver supports CUDA 12.4 but this build needs CUDA 13.0: update the NVIDIA driver" err.txt
check "old driver: json says why" python3 -c '
import json
j = json.load(open("old.json"))
assert j["ok"] is False and "update the NVIDIA driver" in j["error"] and j["gpus"] == [], j
'

"$amsp" gpu-info --cuda-device 2 >out.txt 2>err.txt
rc=$?
check "absent GPU: exit 2, one line" test "$rc" -eq 2 -a "$(cat out.txt err.txt | wc -l)" -eq 1
check "absent GPU: names the count" grep -q -- "--cuda-device 2: there are 2 visible GPUs" err.txt

echo "$failures failed"
[ "$failures" -eq 0 ]
