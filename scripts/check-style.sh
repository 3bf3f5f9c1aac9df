#!/usr/bin/env bash
# The style checks CI runs: clang-format over every C/C++ source (.clang-format), clang-tidy's
# checks over the library's layers (.clang-tidy), and .editorconfig's basics (a final newline, no
# trailing whitespace, no tabs in sources). Exit status 1 on any finding, with the findings.
#   scripts/check-style.sh          check
#   scripts/check-style.sh --fix    reformat the sources in place (clang-format only)
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
# Symbolic links (python/stowage/_shim/stowage.h) are their targets' business: clang-format -i
# would replace the link with a copy.
sources=$(git ls-files -s '*.cpp' '*.hpp' '*.h' '*.c' '*.cu' '*.cuh' | awk '$1 != "120000" {print $4}' |
  grep -v '^tests/fuzz/corpus/')

if [[ ${1:-} == --fix ]]; then
  # shellcheck disable=SC2086
  clang-format -i $sources
  exit 0
fi

echo "clang-format ($(echo "$sources" | wc -l) files)"
# shellcheck disable=SC2086
if ! clang-format --dry-run -Werror $sources 2> /tmp/stowage-format.log; then
  grep -E '^[^ ].*(warning|error):' /tmp/stowage-format.log | head -40
  echo "clang-format: $(grep -c 'warning:\|error:' /tmp/stowage-format.log) places differ; run scripts/check-style.sh --fix"
  status=1
fi

echo ".editorconfig basics"
while IFS= read -r f; do
  [[ -f $f ]] || continue
  case $f in *.md|*.csv|*.json|tests/fuzz/corpus/*|tests/data/*|*.pickle|*.pt) continue ;; esac
  if [[ -s $f && $(tail -c1 "$f" | od -An -c | tr -d ' ') != '\n' ]]; then echo "$f: no newline at end of file"; status=1; fi
  if grep -nE '[[:space:]]+$' "$f" > /dev/null; then echo "$f:$(grep -nE '[[:space:]]+$' "$f" | head -1 | cut -d: -f1): trailing whitespace"; status=1; fi
done < <(git ls-files | grep -Ev '\.(png|svg|gz|xz|tgz|bin)$')

echo "clang-tidy (library layers)"
build=${STYLE_BUILD:-build-style}
cmake -S . -B "$build" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DSTOWAGE_CUDA=OFF -DSTOWAGE_TESTS=OFF \
  -DSTOWAGE_BENCH=OFF > /dev/null || { echo "clang-tidy: configure failed"; exit 1; }
layers=$(git ls-files 'common/*.cpp' 'device/*.cpp' 'allocator/*.cpp' 'simd/*.cpp' 'precision/*.cpp' \
  'recompute/*.cpp' 'offload/*.cpp' 'runtime/*.cpp' 'tools/*.cpp' | grep -v '_cuda\.cpp$')
if ! echo "$layers" | xargs -n 4 -P "${JOBS:-2}" clang-tidy -p "$build" --quiet > /tmp/stowage-tidy.log 2>&1; then
  grep -E '(warning|error):' /tmp/stowage-tidy.log | grep -v '^Error while processing' | sort -u | head -40
  status=1
fi
[[ $status -eq 0 ]] && echo "style: clean"
exit $status
