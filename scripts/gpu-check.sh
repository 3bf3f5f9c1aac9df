#!/usr/bin/env bash
# Runs stowage's checks on a machine with a GPU from a build made elsewhere.
#
#   scripts/gpu-check.sh prepare   on the build machine (Debian with the toolkit; no GPU needed):
#                                  a Release build with CUDA in build-gpu/, stripped, its tests
#                                  discovered, packed with the shared libraries its programs need
#                                  into carry/gpu-check.tar.xz (carry/ is ignored by git)
#   scripts/gpu-check.sh run       on the GPU machine, from the repository root, with carry/ carried
#                                  there: `stowage info`, ctest, the benchmarks and
#                                  tests/integration/torch_pluggable.py; logs go to $OUT (or
#                                  ./gpu-check-out), a summary is printed last
#
# The GPU machine has the CUDA driver, cmake and PyTorch but none of the Debian libraries, hence
# the library folder. A CMake build holds absolute paths, so `run` unpacks it at the path it was
# built at, and links the build machine's source path to this checkout when they differ.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${GPU_BUILD:-$ROOT/build-gpu}
CARRY=$ROOT/carry
ARCHIVE=$CARRY/gpu-check.tar.xz

prepare() {
  set -e
  cmake -S "$ROOT" -B "$BUILD" -DSTOWAGE_CUDA=ON -DSTOWAGE_TESTS=ON -DSTOWAGE_BENCH=ON \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="80;90"
  nice cmake --build "$BUILD" -j"${JOBS:-2}"
  local programs
  programs=$(find "$BUILD" -path "$BUILD/CMakeFiles" -prune -o -type f -perm -u+x \
    \( -name '*_test' -o -name '*_bench' -o -name '*_tool' -o -name stowage -o -name 'libstowage.so*' \) -print)
  # shellcheck disable=SC2086
  strip --strip-unneeded $programs
  # Discover the GoogleTest cases here, after stripping: the GPU machine's cmake then finds the
  # lists up to date and never needs this machine's GoogleTestAddTests.cmake.
  (cd "$BUILD" && ctest -N > /dev/null)
  rm -rf "$BUILD/gpu-lib" && mkdir -p "$BUILD/gpu-lib"
  # Every shared library the programs use, except the C/C++ runtime the GPU machine has.
  # shellcheck disable=SC2086
  ldd $programs 2>/dev/null | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libpthread|libdl|librt)\.so' |
    while read -r lib; do cp -L "$lib" "$BUILD/gpu-lib/"; done
  mkdir -p "$CARRY"
  echo "$ROOT" > "$CARRY/gpu-check.source_dir"
  echo "$BUILD" > "$CARRY/gpu-check.build_dir"
  # Paths stored without the leading '/': `run` unpacks with -C / to the same place.
  tar -C / -cJf "$ARCHIVE" --exclude=CMakeFiles --exclude=Testing --exclude='*.o' --exclude='*.a' \
    "${BUILD#/}"
  ls -l "$ARCHIVE"
  local size
  size=$(stat -c %s "$ARCHIVE")
  if (( size > 60 * 1024 * 1024 )); then
    echo "gpu-check: $ARCHIVE is over 60 MiB; the carried tree may hold 64 MiB in all" >&2
    exit 1
  fi
  echo "carry: carry (the folder); then on the GPU machine: scripts/gpu-check.sh run"
}

run() {
  local out=${OUT:-$ROOT/gpu-check-out}
  mkdir -p "$out"
  [[ -f $ARCHIVE ]] || { echo "gpu-check: $ARCHIVE missing: run 'prepare' here and carry carry/" >&2; exit 2; }
  local src build
  src=$(cat "$CARRY/gpu-check.source_dir")
  build=$(cat "$CARRY/gpu-check.build_dir")
  if [[ $src != "$ROOT" && ! -e $src ]]; then
    mkdir -p "$(dirname "$src")" && ln -s "$ROOT" "$src"
  fi
  tar -C / -xJf "$ARCHIVE" || { echo "gpu-check: cannot unpack $ARCHIVE" >&2; exit 2; }
  export LD_LIBRARY_PATH=$build/gpu-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export STOWAGE_LOG_LEVEL=${STOWAGE_LOG_LEVEL:-off}

  { nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } > "$out/gpu.txt" 2>&1
  "$build/stowage" info > "$out/info.txt" 2>&1
  local info_rc=$?

  # install builds a consumer against the Debian packages, which the GPU machine lacks.
  (cd "$build" && timeout "${CTEST_TIMEOUT:-420}" ctest --output-on-failure -j"${CTEST_JOBS:-8}" --timeout 240 \
    -E "${CTEST_EXCLUDE:-^install}") > "$out/ctest.log" 2>&1
  local ctest_rc=$?

  : > "$out/bench.log"
  for b in "$build"/bench/*_bench; do
    [[ -x $b ]] || continue
    echo "== $(basename "$b")" >> "$out/bench.log"
    timeout 60 "$b" --benchmark_min_time=0.1 >> "$out/bench.log" 2>&1 || echo "(exit $?)" >> "$out/bench.log"
  done

  PYTHONUNBUFFERED=1 timeout 300 python3 "$ROOT/tests/integration/torch_pluggable.py" "$build/libstowage.so" \
    > "$out/torch.log" 2>&1
  local torch_rc=$?

  {
    echo "gpu:   $(head -1 "$out/gpu.txt")"
    echo "info:  exit $info_rc; $(grep -m1 '^CUDA' "$out/info.txt")"
    echo "ctest: exit $ctest_rc; $(grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -1)"
    grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)\)' "$out/ctest.log" | head -20
    echo "cuda device tests: $(grep -cE 'DeviceTest.*/cuda .*Passed' "$out/ctest.log") passed, $(grep -cE 'DeviceTest.*/cuda .*(Failed|Skipped|\*\*\*)' "$out/ctest.log") failed or skipped"
    echo "torch: exit $torch_rc; $(tail -1 "$out/torch.log")"
  } | tee "$out/summary.txt"
  [[ $ctest_rc -eq 0 && $torch_rc -eq 0 && $info_rc -eq 0 ]]
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
