#!/usr/bin/env bash
# Runs a test's command with its output shown, and passes only when the command
# exits with the expected status AND every PATTERN matches a line of its output.
#
# CTest's PASS_REGULAR_EXPRESSION alone ignores the exit code: a program that
# prints its summary and then crashes (in MPI_Finalize, in a destructor, on one
# rank) would pass. Tests that look for a line run under this instead.
#
#   usage: expect_output.sh [--exit N] PATTERN... -- COMMAND [ARG...]
#
#   PATTERN   an extended regular expression (grep -E), matched line by line
#             against standard output and standard error together; each one
#             given must match some line
#   --exit N  the exit status the command must have (default 0): a test of a job
#             that must fail names the status its failure gives
#
# Exit 0 when all hold; else 1 after one line that says what did not.
set -uo pipefail

usage() {
  echo "usage: expect_output.sh [--exit N] PATTERN... -- COMMAND [ARG...]" >&2
  exit 2
}
want=0
if [[ ${1-} == --exit ]]; then
  [[ ${2-} =~ ^[0-9]+$ ]] || usage
  want=$2
  shift 2
fi
patterns=()
while [[ $# -gt 0 && $1 != -- ]]; do
  patterns+=("$1")
  shift
done
[[ ${#patterns[@]} -gt 0 && $# -ge 2 ]] || usage
shift

log=$(mktemp "${TMPDIR:-/tmp}/expect_output.XXXXXX") || exit 1
trap 'rm -f "$log"' EXIT

"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

problems=()
[[ $rc -eq $want ]] || problems+=("${1##*/} exited $rc (expected $want)")
for pattern in "${patterns[@]}"; do
  grep -aEq -e "$pattern" "$log"
  case $? in
    0) ;;
    1) problems+=("no line matches '$pattern'") ;;
    *) problems+=("cannot match '$pattern'") ;;
  esac
done
[[ ${#problems[@]} -eq 0 ]] && exit 0
joined=$(printf '%s; ' "${problems[@]}")
echo "expect_output.sh: FAIL: ${joined%; }"
exit 1
