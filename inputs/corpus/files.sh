#!/usr/bin/env bash
# Prints the files of amsp's built-in training corpus, one path per line,
# sorted: the plain-text fortune files of Debian's `fortunes` package (and of
# `fortunes-min`, which it depends on), without the strfile indexes (*.dat)
# and the *.u8 symlinks. See README.md in this directory.
set -euo pipefail
export LC_ALL=C

dir=/usr/share/games/fortunes
need="the built-in corpus needs Debian's fortunes package: apt-get install fortunes"

status=$(dpkg-query -W -f='${Status}' fortunes 2>/dev/null || true)
if [[ "$status" != *" installed" ]] || [[ ! -d "$dir" ]]; then
  echo "$need" >&2
  exit 1
fi

# Only what the packages own, so other fortune packages installed into the same
# directory do not change the corpus.
mapfile -t files < <(
  dpkg-query -L fortunes fortunes-min 2>/dev/null |
    grep -E "^$dir/[^/]+\$" |
    grep -v -E '\.(dat|u8)$' |
    while IFS= read -r f; do [[ -f "$f" && ! -L "$f" ]] && printf '%s\n' "$f"; done |
    sort -u
)
if (( ${#files[@]} == 0 )); then
  echo "$need (no corpus files found in $dir)" >&2
  exit 1
fi

total=$(cat -- "${files[@]}" | wc -c)
if (( total < 1000000 )); then
  echo "the built-in corpus is only $total bytes, expected at least 1 MB: is the fortunes package complete? apt-get install --reinstall fortunes fortunes-min" >&2
  exit 1
fi

printf '%s\n' "${files[@]}"
