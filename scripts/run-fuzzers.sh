#!/usr/bin/env bash
# Builds the libFuzzer targets (preset `fuzz`, clang) and runs each for a bounded time
# (FUZZ_SECONDS, default 60). A crashing input is kept under tests/fuzz/regressions/<target>/,
# where every ordinary test build replays it; the script then fails. FUZZ_SEED (default 1) fixes
# the mutation sequence so a CI run is repeatable; FUZZ_SEED=0 draws a new seed each run (for
# longer explorations by hand).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
seed=${FUZZ_SEED:-1}
cmake --preset fuzz >/dev/null
targets=$(ls tests/fuzz/*_fuzz.cpp | xargs -n1 basename | sed 's/\.cpp$//')
cmake --build --preset fuzz --target $targets
failed=0
for t in $targets; do
  work=$(mktemp -d)
  cp -r "tests/fuzz/corpus/$t/." "$work/" 2>/dev/null || true
  keep="tests/fuzz/regressions/$t"
  mkdir -p "$keep"
  echo "== $t for ${seconds}s"
  if ! ASAN_OPTIONS=detect_leaks=1 ./build-fuzz/tests/fuzz/$t "$work" -max_total_time="$seconds" -seed="$seed" \
       -rss_limit_mb=4096 -timeout=20 -artifact_prefix="$keep/" -print_final_stats=1 2>"$work.log"; then
    echo "!! $t found a failure; input kept in $keep/"
    tail -40 "$work.log"
    failed=1
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$work.log" || true
  fi
  rmdir "$keep" 2>/dev/null || true
  rm -rf "$work" "$work.log"
done
exit $failed
