#!/usr/bin/env bash
# Runs stowage's checks on a machine with a GPU from a build made elsewhere.
#
#   scripts/gpu-check.sh prepare   on the build machine (Debian with the toolkit; no GPU needed):
#                                  a Release build with CUDA in build-gpu/, stripped, its tests
#                                  discovered, packed with the shared libraries its programs need
#                                  into carry/gpu-check.tar.xz (carry/ is ignored by git)
#   scripts/gpu-check.sh run       on the GPU machine, from the repository root, with carry/ carried
#                                  there: `stowage info`, ctest, tests/integration/torch_pluggable.py
#                                  and the GPU benchmarks (GPU_CHECK_PHASES picks phases,
#                                  GPU_CHECK_BENCH benchmarks); logs are
#                                  packed into $OUT/gpu-check.tgz (or ./gpu-check-out), a summary is
#                                  printed last; then, here, `python3 bench/gpu_results.py --logs DIR`
#                                  (DIR: the unpacked archive) writes RESULTS.md's GPU section
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
  # The commit the build is of, for the results (bench/gpu_results.py); "+changes" when the tree differs.
  { git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown; } | tr -d '\n' > "$CARRY/gpu-check.commit"
  git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo -n "+changes" >> "$CARRY/gpu-check.commit"
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
  # GPU_CHECK_PHASES picks what runs (default: all): tests (stowage info, ctest), torch
  # (tests/integration/torch_pluggable.py, the Python package's tests), sanitize (compute-sanitizer's
  # memcheck, racecheck and synccheck over the CUDA test instances), bench (the BM_Cuda*
  # benchmarks, offload_tool --cuda, bench/torch_allocator_bench.py, bench/torch_techniques_bench.py). Logs go to a work folder packed into $OUT/gpu-check.tgz
  # (a device machine returns few files), and summary.txt beside it.
  local phases=" ${GPU_CHECK_PHASES:-tests torch sanitize bench} "
  local out=${OUT:-$ROOT/gpu-check-out}
  local logs=${TMPDIR:-/tmp}/gpu-check-logs  # outside $out: only the archive and summary come back
  rm -rf "$logs" && mkdir -p "$logs" "$out"
  [[ -f $ARCHIVE ]] || { echo "gpu-check: $ARCHIVE missing: run 'prepare' here and carry carry/" >&2; exit 2; }
  local src build
  src=$(cat "$CARRY/gpu-check.source_dir")
  build=$(cat "$CARRY/gpu-check.build_dir")
  if [[ $src != "$ROOT" && ! -e $src ]]; then
    mkdir -p "$(dirname "$src")" && ln -s "$ROOT" "$src"
  fi
  tar -C / -xJf "$ARCHIVE" || { echo "gpu-check: cannot unpack $ARCHIVE" >&2; exit 2; }
  export LD_LIBRARY_PATH=$build/gpu-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # NCCL for the registration test: the toolkit's, or the one PyTorch's wheels bring.
  local nccl
  nccl=$(find /usr/lib /usr/local /opt "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)" \
    -name 'libnccl.so.2' 2>/dev/null | head -1)
  [[ -n $nccl ]] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$nccl")
  export STOWAGE_LOG_LEVEL=${STOWAGE_LOG_LEVEL:-off}
  local rc info_rc=- ctest_rc=- torch_rc=- bench_rc=- sanitize_rc=-
  # Packed after every phase, so a command stopped at its time limit still returns what ran.
  pack() { tar -C "$logs" -czf "$out/gpu-check.tgz" .; }

  printf 'date=%s\ncommit=%s\n' "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(cat "$CARRY/gpu-check.commit" 2>/dev/null)" \
    > "$logs/run.meta"
  { nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv;
    echo "nccl: ${nccl:-not found}"; nproc; } > "$logs/gpu.txt" 2>&1

  # The tests and the PyTorch tests check correctness, not speed: they run side by side. Each
  # writes its exit status to a file (a background job's variables do not come back).
  phase_tests() {
    "$build/stowage" info > "$logs/info.txt" 2>&1
    echo $? > "$logs/info.rc"
    # install builds a consumer against the Debian packages, which the GPU machine lacks; python_package
    # runs the build machine's /usr/bin/python3 (the torch phase runs the same tests with this python3).
    # layering and exported_symbols run cmake at the build machine's path: link the GPU machine's there.
    [[ -x /usr/bin/cmake ]] || ln -s "$(command -v cmake)" /usr/bin/cmake 2>/dev/null
    (cd "$build" && timeout "${CTEST_TIMEOUT:-300}" ctest --output-on-failure -j"${CTEST_JOBS:-8}" --timeout 240 \
      -E "${CTEST_EXCLUDE:-^(install.*|python_package)$}" ${CTEST_ARGS:-}) > "$logs/ctest.log" 2>&1
    echo $? > "$logs/ctest.rc"
  }
  phase_torch() {
    # The threaded-pair benchmark's extension builds meanwhile (a minute of compiling, cached).
    if [[ $phases == *" bench "* ]]; then
      (cd "$ROOT/bench" && timeout 240 python3 -c 'import torch_allocator_bench as b; b.threads_module()') \
        > "$logs/threads_pair_build.log" 2>&1 &
    fi
    PYTHONUNBUFFERED=1 timeout 200 python3 "$ROOT/tests/integration/torch_pluggable.py" "$build/libstowage.so" \
      > "$logs/torch.log" 2>&1
    local r=$?
    # The Python package's tests, GPU ones included (the shim compiles against this torch).
    # test_torch_gpu.py fills the GPU on purpose (out of memory): it runs after the ctest phase.
    if python3 -c "import pytest" 2>/dev/null; then
      STOWAGE_LIBRARY="$build/libstowage.so" PYTHONPATH="$ROOT/python" timeout "${PYTEST_TIMEOUT:-330}" \
        python3 -m pytest -q -rs -p no:cacheprovider --ignore="$ROOT/python/tests/test_torch_gpu.py" \
        "$ROOT/python/tests" > "$logs/pytest.log" 2>&1 || r=$?
    else
      echo "pytest is not installed for $(command -v python3)" > "$logs/pytest.log"
    fi
    wait
    echo $r > "$logs/torch.rc"
  }
  # compute-sanitizer over the CUDA instances of the suites whose kernels stowage writes: memcheck
  # on each, racecheck and synccheck on those with warp-level or shared-memory code.
  phase_sanitize() {
    local cs r=0 tool bin
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
    if [[ ! -x $cs ]]; then
      echo "compute-sanitizer not found" > "$logs/sanitize.log"
      echo 2 > "$logs/sanitize.rc"
      return
    fi
    # The NCCL registration test is left out: NCCL's own start-up probes kernel images it was not
    # built for, which memcheck reports as API errors in libnccl.
    local filter='*cuda*:*Cuda*:*CUDA*:*StepsQueuedOnADeviceStream*:-*RegistersWithNccl*'
    local kernels="precision_device_split_test precision_device_optimizers_test precision_bucket_test
      recompute_activations_test offload_optimizer_test"
    local others="capi_precision_test allocator_cuda_test offload_swap_schedule_test recompute_memory_test"
    for tool in memcheck racecheck synccheck; do
      for bin in $kernels $([[ $tool == memcheck ]] && echo "$others"); do
        echo "== $tool $bin" >> "$logs/sanitize.$tool.log"
        if timeout 150 "$cs" --tool "$tool" --error-exitcode 97 "$build/tests/$bin" --gtest_filter="$filter" \
          >> "$logs/sanitize.$tool.log" 2>&1; then
          echo "clean: $tool $bin" >> "$logs/sanitize.log"
        else
          echo "FAILED ($?): $tool $bin" >> "$logs/sanitize.log"
          r=1
        fi
      done
    done
    echo $r > "$logs/sanitize.rc"
  }
  [[ $phases == *" tests "* ]] && phase_tests &
  [[ $phases == *" torch "* ]] && phase_torch &
  [[ $phases == *" sanitize "* ]] && phase_sanitize &
  wait
  [[ -f $logs/sanitize.rc ]] && sanitize_rc=$(cat "$logs/sanitize.rc")
  [[ -f $logs/info.rc ]] && info_rc=$(cat "$logs/info.rc")
  [[ -f $logs/ctest.rc ]] && ctest_rc=$(cat "$logs/ctest.rc")
  [[ -f $logs/torch.rc ]] && torch_rc=$(cat "$logs/torch.rc")
  # GPU_CHECK_GPU_TESTS=0 leaves them out (a rerun within a lease that ran them).
  if [[ $phases == *" torch "* && ${GPU_CHECK_GPU_TESTS:-1} != 0 ]] && python3 -c "import pytest" 2>/dev/null; then
    STOWAGE_LIBRARY="$build/libstowage.so" PYTHONPATH="$ROOT/python" timeout 240 \
      python3 -m pytest -q -rs -p no:cacheprovider "$ROOT/python/tests/test_torch_gpu.py" > "$logs/pytest_gpu.log" 2>&1 ||
      torch_rc=$?
  fi
  pack

  if [[ $phases == *" bench "* ]]; then
    bench_rc=0
    # GPU_CHECK_BENCH picks benchmarks (default: all), run in this order, the PyTorch ones first:
    # torch_allocator, techniques (pytorch then stowage allocator), offload, offload_large,
    # offload_large_8, swap_large, recompute_paths, cpp (the BM_Cuda* benchmarks), offload_tool.
    local benches=" ${GPU_CHECK_BENCH:-torch_allocator techniques offload offload_large offload_large_8 swap_large recompute_paths cpp offload_tool} "
    if [[ $benches == *" torch_allocator "* ]]; then
      PYTHONUNBUFFERED=1 timeout 360 python3 "$ROOT/bench/torch_allocator_bench.py" "$build/libstowage.so" \
        > "$logs/torch_allocator_bench.txt" 2>&1 || bench_rc=$?
      pack
    fi
    # One run of the techniques bench on the small GPT (its arguments after the two given); logs
    # torch_techniques.NAME.json and .txt.
    techniques() {
      local name=$1 limit=$2
      shift 2
      STOWAGE_LIBRARY="$build/libstowage.so" PYTHONUNBUFFERED=1 timeout "$limit" python3 "$ROOT/bench/torch_techniques_bench.py" \
        "$@" --json "$logs/torch_techniques.$name.json" > "$logs/torch_techniques.$name.txt" 2>&1 || bench_rc=$?
      pack
    }
    local offload="torch,shared,offload_mapped,offload_mapped_overlap,offload_streamed,torch_again"
    # With PyTorch's allocator and with stowage's.
    local allocator
    for allocator in pytorch stowage; do
      [[ $benches == *" techniques "* || $benches == *" techniques_$allocator "* ]] || continue
      # shellcheck disable=SC2046
      techniques $allocator 150 --allocator $allocator \
        $([[ $allocator == pytorch ]] && echo "--profile torch,shared,swap,recompute --recompute-hidden 4096,8192")
    done
    # Optimizer-state offload against shared storage on device, with gradient accumulation 4.
    [[ $benches == *" offload "* ]] && techniques offload 180 --accumulate 4 --steps 12 --configs $offload
    # The same at 4x the tokens a micro-batch: mapped offload moves m and v over the link once a
    # step (16 B a parameter), so its share of the step falls as the step's compute grows; at
    # batch 8 the link alone is ~8.6 % of the step, at batch 32 ~2 %. And at 8 micro-batches a
    # step, where the link's share halves again.
    [[ $benches == *" offload_large "* ]] &&
      techniques offload_large 360 --accumulate 4 --batch 32 --steps 8 --configs $offload
    [[ $benches == *" offload_large_8 "* ]] &&
      techniques offload_large_8 360 --accumulate 8 --batch 32 --steps 6 --configs $offload
    # Swap and recompute at batch 32, where the configurations' costs stand above the run's noise.
    [[ $benches == *" swap_large "* ]] &&
      techniques swap_large 300 --batch 32 --steps 8 --configs torch,swap,recompute,all,torch_again
    # Recompute's cost in a whole layer's forward + backward, in place against the general path.
    if [[ $benches == *" recompute_paths "* ]]; then
      PYTHONUNBUFFERED=1 timeout 180 python3 "$ROOT/bench/torch_recompute_paths.py" --device cuda --dtype bfloat16 \
        --hidden 1024,4096,8192 --tokens 8192 --json "$logs/torch_recompute_paths.json" \
        > "$logs/torch_recompute_paths.txt" 2>&1 || bench_rc=$?
      pack
    fi
    if [[ $benches == *" cpp "* ]]; then
      local reps="--benchmark_repetitions=5 --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true"
      local b
      for b in allocator_bench precision_bench offload_bench; do
        # shellcheck disable=SC2086
        timeout 150 "$build/bench/$b" --benchmark_filter=BM_Cuda --benchmark_min_time=0.1 $reps \
          --benchmark_out="$logs/$b.gpu.json" --benchmark_out_format=json > "$logs/$b.gpu.txt" 2>&1 || bench_rc=$?
        pack
      done
    fi
    # Swap over the real link, compute memory-bound (memsets), at two tensor sizes.
    if [[ $benches == *" offload_tool "* ]]; then
      local sizes
      for sizes in "--attn-mib 32 --mlp-mib 16" "--attn-mib 256 --mlp-mib 128"; do
        # shellcheck disable=SC2086
        timeout 120 "$build/bench/offload_tool" --cuda 1 --steps 5 $sizes || bench_rc=$?
      done > "$logs/offload_tool.gpu.md" 2>&1
      pack
    fi
  fi

  {
    echo "gpu:   $(head -1 "$logs/gpu.txt"); phases:$phases"
    if [[ $info_rc != - ]]; then
      echo "info:  exit $info_rc; $(grep -m1 -i 'cuda' "$logs/info.txt")"
      echo "ctest: exit $ctest_rc; $(grep -E 'tests passed|tests failed' "$logs/ctest.log" | tail -1)"
      grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|Not Run)\)' "$logs/ctest.log" | head -30
      local cuda_lines
      cuda_lines=$(grep -iE 'Test +#[0-9]+: [^ ]*cuda' "$logs/ctest.log")
      echo "cuda cases: $(grep -c ' Passed' <<<"$cuda_lines") passed," \
        "$(grep '\*\*\*' <<<"$cuda_lines" | grep -vc Skipped) failed," \
        "$(grep -c '\*\*\*Skipped' <<<"$cuda_lines") skipped"
    fi
    [[ $torch_rc != - ]] && echo "torch: exit $torch_rc; $(tail -1 "$logs/torch.log")"
    [[ -f $logs/pytest.log ]] && echo "pytest: $(tail -1 "$logs/pytest.log"); gpu: $(tail -1 "$logs/pytest_gpu.log" 2>/dev/null)"
    grep -hE '^(FAILED|ERROR) ' "$logs/pytest.log" "$logs/pytest_gpu.log" 2>/dev/null | head -20
    for f in "$logs"/torch_techniques.*.txt; do [[ -f $f ]] && { echo "== $(basename "$f")"; tail -12 "$f"; }; done
    [[ $sanitize_rc != - ]] && echo "sanitize: exit $sanitize_rc; $(grep -c '^clean' "$logs/sanitize.log") clean," \
      "$(grep -c '^FAILED' "$logs/sanitize.log") failed" && grep '^FAILED' "$logs/sanitize.log"
    [[ $bench_rc != - ]] && echo "bench: exit $bench_rc"
  } > "$logs/summary.txt"
  cp "$logs/summary.txt" "$out/summary.txt"
  pack
  cat "$out/summary.txt"
  for rc in $info_rc $ctest_rc $torch_rc $sanitize_rc $bench_rc; do [[ $rc == - || $rc == 0 ]] || return 1; done
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
