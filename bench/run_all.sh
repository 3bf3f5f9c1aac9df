#!/usr/bin/env bash
# Builds every benchmark in a Release build of its own, runs the CPU benchmarks and tools with the
# arguments the per-area write-ups (bench/results/*.md) use, and regenerates bench/RESULTS.md:
# the machine, date, commit and command, then one table per area with the ratio against the peer
# measured in the same run (bench/report.py computes them from Google Benchmark's JSON output).
#
#   bash bench/run_all.sh [--quick] [--build-dir DIR] [--out FILE] [--jobs N] [--no-cuda] [--no-build]
#
#   --quick       fewer repetitions and shorter runs (about a minute after the build)
#   --full        the arguments of the area write-ups (the default; a few minutes after the build)
#   --build-dir   build directory (default: build-bench in the repository root)
#   --out         the report to write (default: bench/RESULTS.md)
#   --jobs        parallel compile jobs (default: 2)
#   --no-cuda     configure with STOWAGE_CUDA=OFF (default: AUTO, as the `default` preset)
#   --no-build    run what the build directory already holds
#
# GPU benchmarks (precision_bench's BM_Cuda*) run only when nvidia-smi sees a GPU; then the GPU
# section of the report is rewritten. Otherwise the GPU section already in the report is kept.
# Every *_bench.cpp and *_tool.cpp in bench/ is built and run; a tool this script has no
# arguments for runs with none (with --quick in quick mode when its usage names that option), and
# its standard output (markdown) goes into the report as it is.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode=full
build_dir="$root/build-bench"
out="$root/bench/RESULTS.md"
jobs=2
cuda=AUTO
do_build=1
command_line="bash bench/run_all.sh${*:+ $*}"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) mode=quick ;;
    --full) mode=full ;;
    --build-dir) build_dir="$(realpath -m "$2")"; shift ;;
    --out) out="$(realpath -m "$2")"; shift ;;
    --jobs) jobs="$2"; shift ;;
    --no-cuda) cuda=OFF ;;
    --no-build) do_build=0 ;;
    -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_all.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

command -v cmake >/dev/null || { echo "run_all.sh: cmake not found" >&2; exit 1; }
command -v python3 >/dev/null || { echo "run_all.sh: python3 not found" >&2; exit 1; }

raw="$build_dir/bench-results/$mode"
rm -rf "$raw"
mkdir -p "$raw"
log() { printf '[run_all %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
t_start=$(date +%s)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- targets: one per bench/*_bench.cpp and bench/*_tool.cpp present now ----
mapfile -t benches < <(find "$root/bench" -maxdepth 1 -name '*_bench.cpp' -printf '%f\n' | sed 's/\.cpp$//' | sort)
mapfile -t tools < <(find "$root/bench" -maxdepth 1 -name '*_tool.cpp' -printf '%f\n' | sed 's/\.cpp$//' | sort)

# ---- build ----
: >"$raw/build_failed"
if [[ $do_build == 1 ]]; then
  log "configuring $build_dir (Release, STOWAGE_CUDA=$cuda, benchmarks on, tests off)"
  t0=$(date +%s)
  cmake -S "$root" -B "$build_dir" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release \
    -DSTOWAGE_CUDA="$cuda" -DSTOWAGE_BENCH=ON -DSTOWAGE_TESTS=OFF >"$raw/configure.log" 2>&1 ||
    { cat "$raw/configure.log" >&2; echo "run_all.sh: configure failed" >&2; exit 1; }
  log "building ${#benches[@]} benchmarks and ${#tools[@]} tools with -j$jobs"
  if ! cmake --build "$build_dir" -j"$jobs" --target "${benches[@]}" "${tools[@]}" >"$raw/build.log" 2>&1; then
    # Build what builds; a target that fails is reported, not fatal.
    log "building all at once failed; building target by target"
    for t in "${benches[@]}" "${tools[@]}"; do
      cmake --build "$build_dir" -j"$jobs" --target "$t" >>"$raw/build.log" 2>&1 || echo "$t" >>"$raw/build_failed"
    done
  fi
  echo $(( $(date +%s) - t0 )) >"$raw/build_seconds"
fi
built=0
for t in "${benches[@]}" "${tools[@]}"; do
  if [[ -x $build_dir/bench/$t ]] && ! grep -qx "$t" "$raw/build_failed"; then built=$((built + 1)); fi
done
if [[ $built == 0 ]]; then
  tail -40 "$raw/build.log" >&2 || true
  echo "run_all.sh: nothing built; $out left as it was (build log: $raw/build.log)" >&2
  exit 1
fi

# ---- run ----
has_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then has_gpu=1; fi

# Arguments per benchmark, as the area write-ups use them (quick: fewer repetitions, less time).
declare -A bench_args
if [[ $mode == full ]]; then
  bench_args[allocator_bench]="--benchmark_min_time=0.1 --benchmark_repetitions=7 --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true"
  bench_args[capi_bench]="--benchmark_min_time=0.2 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true"
  bench_args[device_bench]="--benchmark_repetitions=3 --benchmark_report_aggregates_only=true"
  bench_args[offload_bench]="--benchmark_min_time=0.2"
  bench_args[precision_bench]="--benchmark_min_time=0.3 --benchmark_repetitions=7 --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true"
  bench_args[recompute_bench]=""
  offload_steps=7 replay_repeat_large=50 replay_repeat_small=200
else
  bench_args[allocator_bench]="--benchmark_min_time=0.05 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true"
  bench_args[capi_bench]="--benchmark_min_time=0.05 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true"
  bench_args[device_bench]=""
  bench_args[offload_bench]="--benchmark_min_time=0.05"
  bench_args[precision_bench]="--benchmark_min_time=0.1"
  bench_args[recompute_bench]="--benchmark_min_time=0.1"
  offload_steps=3 replay_repeat_large=10 replay_repeat_small=40
fi

cuda_benchmarks=none
squeeze() { echo "$1" | tr -s ' ' | sed 's/ *$//'; }
loadavg() { cut -d' ' -f1 /proc/loadavg; }
failed() { grep -qx "$1" "$raw/build_failed"; }

# Runs one executable: records its command, wall seconds, exit status and the load average
# before and after in $raw/NAME.meta (key=value lines).
run_one() {  # name cmd-for-report stdout-file -- argv...
  local name="$1" shown="$2" stdout="$3"; shift 4
  local l0 t0 rc=0
  l0=$(loadavg); t0=$(date +%s.%N)
  (cd "$raw" && "$@") >"$stdout" 2>"$raw/$name.stderr" || rc=$?
  {
    echo "command=$shown"
    echo "seconds=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
    echo "rc=$rc"
    echo "load_before=$l0"
    echo "load_after=$(loadavg)"
  } >"$raw/$name.meta"
  [[ $rc == 0 ]] || log "$name exited with status $rc (see $raw/$name.stderr)"
}

for b in "${benches[@]}"; do
  exe="$build_dir/bench/$b"
  if failed "$b" || [[ ! -x $exe ]]; then log "skip $b: not built"; echo "$b" >>"$raw/missing"; continue; fi
  args=${bench_args[$b]-}
  filter=""
  # GPU benchmarks run in their own pass below.
  if "$exe" --benchmark_list_tests=true 2>/dev/null | grep -q '^BM_Cuda'; then
    filter="--benchmark_filter=-BM_Cuda"
    cuda_benchmarks=built
  fi
  log "running $b $args $filter"
  # shellcheck disable=SC2086
  run_one "$b" "$(squeeze "$b $args $filter")" "$raw/$b.console" -- \
    "$exe" $args $filter --benchmark_out="$raw/$b.json" --benchmark_out_format=json
  if [[ -n $filter && $has_gpu == 1 ]]; then
    log "running $b GPU benchmarks"
    # shellcheck disable=SC2086
    run_one "$b.gpu" "$(squeeze "$b $args --benchmark_filter=BM_Cuda")" "$raw/$b.gpu.console" -- \
      "$exe" $args --benchmark_filter=BM_Cuda --benchmark_out="$raw/$b.gpu.json" --benchmark_out_format=json
  fi
done

for t in "${tools[@]}"; do
  exe="$build_dir/bench/$t"
  if failed "$t" || [[ ! -x $exe ]]; then log "skip $t: not built"; echo "$t" >>"$raw/missing"; continue; fi
  log "running $t"
  case "$t" in
    offload_tool)
      run_one "$t" "$t --steps $offload_steps" "$raw/$t.md" -- timeout 900 "$exe" --steps "$offload_steps" ;;
    replay_tool)
      # Two synthesized training-step logs, each replayed through stowage and glibc malloc.
      (cd "$raw" && "$exe" --synthesize step.csv >/dev/null &&
        "$exe" --synthesize small.csv --layers 12 --hidden 1024 --seq 1024 --batch 2 >/dev/null) ||
        log "replay_tool --synthesize failed"
      run_one "$t.large" "$t step.csv --repeat $replay_repeat_large" "$raw/$t.large.md" -- \
        timeout 900 "$exe" step.csv --repeat "$replay_repeat_large"
      run_one "$t.small" "$t small.csv --repeat $replay_repeat_small" "$raw/$t.small.md" -- \
        timeout 900 "$exe" small.csv --repeat "$replay_repeat_small"
      rm -f "$raw/step.csv" "$raw/small.csv" ;;
    *)
      # A tool whose usage names --quick gets it in quick mode; otherwise no arguments.
      targs=()
      if [[ $mode == quick ]] && grep -q -- '--quick' "$root/bench/$t.cpp"; then targs=(--quick); fi
      run_one "$t" "$(squeeze "$t ${targs[*]}")" "$raw/$t.md" -- timeout 900 "$exe" "${targs[@]}" ;;
  esac
done

# ---- report ----
{
  echo "mode=$mode"
  echo "command=$command_line"
  echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "dirty=$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | grep -c . || true)"
  echo "untracked=$(git -C "$root" status --porcelain 2>/dev/null | grep -c '^??' || true)"
  echo "cpu=$( (grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- || lscpu | grep -m1 'Model name' | cut -d: -f2-) | sed 's/^ *//')"
  echo "cores=$(nproc)"
  echo "memory=$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "kernel=$(uname -sr)"
  cxx=$(grep -m1 '^CMAKE_CXX_COMPILER:' "$build_dir/CMakeCache.txt" 2>/dev/null | cut -d= -f2)
  echo "compiler=$("${cxx:-c++}" --version 2>/dev/null | head -1)"
  echo "build_type=$(grep -m1 '^CMAKE_BUILD_TYPE:' "$build_dir/CMakeCache.txt" 2>/dev/null | cut -d= -f2)"
  echo "cuda_benchmarks=$cuda_benchmarks"
  echo "gpu=$([[ $has_gpu == 1 ]] && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 || echo none)"
  echo "load_start=$load_start"
  echo "load_end=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "build_seconds=$(cat "$raw/build_seconds" 2>/dev/null || echo 0)"
  echo "total_seconds=$(( $(date +%s) - t_start ))"
  echo "build_dir=$(realpath -m --relative-to="$root" "$build_dir")"
  echo "benches=${benches[*]}"
  echo "tools=${tools[*]}"
} >"$raw/run.meta"

python3 "$root/bench/report.py" --raw "$raw" --out "$out"
log "wrote $out ($(( $(date +%s) - t_start )) s in all; raw results in $raw)"
