#!/usr/bin/env bash
# Runs stowage's checks on a machine with a GPU from a build made elsewhere.
#
#   scripts/gpu-check.sh prepare   on the build machine (Debian, toolkit, no GPU needed):
#                                  builds with CUDA into carry/gpu-build (ignored by git) and
#                                  copies the shared libraries its programs need into carry/gpu-lib
#   scripts/gpu-check.sh run       on the GPU machine, from the repository root, with carry/gpu-build
#                                  and carry/gpu-lib carried there: `stowage info`, ctest, the
#                                  benchmarks and tests/integration/torch_pluggable.py; logs go to
#                                  $OUT (or ./gpu-check-out), a summary is printed last
#
# The GPU machine has the CUDA driver, cmake and PyTorch but none of the Debian libraries, hence
# the library folder. Paths inside a CMake build are absolute, so `run` recreates the build
# machine's source path as a symbolic link when the checkout lives elsewhere.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${GPU_BUILD:-$ROOT/carry/gpu-build}
LIBS=${GPU_LIBS:-$ROOT/carry/gpu-lib}

prepare() {
  set -e
  cmake -S "$ROOT" -B "$BUILD" -DSTOWAGE_CUDA=ON -DSTOWAGE_TESTS=ON -DSTOWAGE_BENCH=ON \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="80;90"
  nice cmake --build "$BUILD" -j"${JOBS:-2}"
  echo "$ROOT" > "$BUILD/source_dir"
  # Object files are not needed to run: keep the carried tree small (64 MiB in all).
  find "$BUILD" \( -name '*.o' -o -name '*.o.d' -o -name '*.a' \) -delete
  rm -rf "$LIBS" && mkdir -p "$LIBS"
  # Every shared library the built programs use, except the C/C++ runtime the GPU machine has.
  find "$BUILD" -type f -perm -u+x \( -name '*_test' -o -name '*_bench' -o -name '*_tool' -o -name stowage \
    -o -name 'libstowage.so*' \) -print0 |
    xargs -0 ldd 2>/dev/null | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libpthread|libdl|librt)\.so' |
    while read -r lib; do cp -L "$lib" "$LIBS/"; done
  du -sh "$BUILD" "$LIBS"
  echo "carry: carry/gpu-build carry/gpu-lib; then on the GPU machine: scripts/gpu-check.sh run"
}

run() {
  local out=${OUT:-$ROOT/gpu-check-out}
  mkdir -p "$out"
  [[ -d $BUILD && -d $LIBS ]] || { echo "gpu-check: $BUILD or $LIBS missing: run 'prepare' and carry both" >&2; exit 2; }
  local src
  src=$(cat "$BUILD/source_dir")
  if [[ $src != "$ROOT" && ! -e $src ]]; then
    mkdir -p "$(dirname "$src")" && ln -s "$ROOT" "$src"
  fi
  export LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export STOWAGE_LOG_LEVEL=${STOWAGE_LOG_LEVEL:-off}

  { nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } > "$out/gpu.txt" 2>&1
  "$BUILD/stowage" info > "$out/info.txt" 2>&1
  local info_rc=$?

  # install builds a consumer against the Debian packages, which the GPU machine lacks.
  (cd "$BUILD" && timeout "${CTEST_TIMEOUT:-420}" ctest --output-on-failure -j"${CTEST_JOBS:-8}" --timeout 240 \
    -E "${CTEST_EXCLUDE:-^install}") > "$out/ctest.log" 2>&1
  local ctest_rc=$?

  : > "$out/bench.log"
  for b in "$BUILD"/bench/*_bench; do
    [[ -x $b ]] || continue
    echo "== $(basename "$b")" >> "$out/bench.log"
    timeout 60 "$b" --benchmark_min_time=0.1 >> "$out/bench.log" 2>&1 || echo "(exit $?)" >> "$out/bench.log"
  done

  PYTHONUNBUFFERED=1 timeout 300 python3 "$ROOT/tests/integration/torch_pluggable.py" "$BUILD/libstowage.so" \
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
