#!/usr/bin/env bash
# clang-format (the repo's .clang-format) over the C++ sources: every .h/.cc
# git tracks (plus new, not-ignored ones), build/ and build-*/ excluded.
#
#   tools/scripts/format.sh          reformat in place
#   tools/scripts/format.sh --check  change nothing; exit 1 and show where
#                                    when anything is unformatted
# Environment: CLANG_FORMAT (default clang-format).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

mode=fix
case "${1:-}" in
  "" | --fix) ;;
  --check) mode=check ;;
  *)
    echo "usage: $0 [--check]" >&2
    exit 2
    ;;
esac
clang_format=${CLANG_FORMAT:-clang-format}
if ! command -v "$clang_format" >/dev/null; then
  echo "format.sh: $clang_format not found (tools/scripts/install-deps.sh installs it)" >&2
  exit 2
fi

files=()
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  while IFS= read -r -d '' f; do
    [[ -f "$f" ]] && files+=("$f")
  done < <(git ls-files -z --cached --others --exclude-standard -- '*.h' '*.cc' ':!:build/**' ':!:build-*/**' |
    sort -zu)
else
  while IFS= read -r -d '' f; do
    files+=("$f")
  done < <(find . -path './build*' -prune -o -path ./.git -prune -o \
    -type f \( -name '*.h' -o -name '*.cc' \) -print0 | sort -z)
fi
if ((${#files[@]} == 0)); then
  echo "format.sh: no C++ files found" >&2
  exit 0
fi

if [[ $mode == fix ]]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 16 -P 2 "$clang_format" -i
  echo "format.sh: formatted ${#files[@]} files"
  exit 0
fi

bad=()
for f in "${files[@]}"; do
  if ! "$clang_format" --dry-run -Werror "$f" >/dev/null 2>&1; then
    bad+=("$f")
  fi
done
if ((${#bad[@]} > 0)); then
  echo "format.sh: ${#bad[@]} of ${#files[@]} files are not clang-formatted:" >&2
  for f in "${bad[@]}"; do
    echo "--- $f" >&2
    "$clang_format" "$f" | diff -u "$f" - | head -n 40 >&2 || true
  done
  echo "format.sh: run tools/scripts/format.sh to fix them" >&2
  exit 1
fi
echo "format.sh: ${#files[@]} files are clang-formatted"
