#!/usr/bin/env bash
# Fails when a tracked C or C++ file differs from what clang-format makes of
# it with the repository's .clang-format, and names the files. Run by the test
# suite (the `format` test) and fixable with:
#   git ls-files '*.cc' '*.h' '*.c' | xargs clang-format -i
set -uo pipefail
cd "$(dirname "$0")/.."
fmt=${CLANG_FORMAT:-clang-format}
command -v "$fmt" >/dev/null || { echo "clang-format not installed: skipped"; exit 77; }
[ -d .git ] || git rev-parse --git-dir >/dev/null 2>&1 || { echo "not a git checkout: skipped"; exit 77; }
bad=()
while IFS= read -r f; do
  [ -f "$f" ] || continue
  "$fmt" --style=file --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files '*.cc' '*.h' '*.c')
if [ ${#bad[@]} -gt 0 ]; then
  echo "not formatted with clang-format ($("$fmt" --version | head -1)):"
  printf '  %s\n' "${bad[@]}"
  echo "fix: git ls-files '*.cc' '*.h' '*.c' | xargs clang-format -i"
  exit 1
fi
echo "every tracked C/C++ file is formatted"
