#!/usr/bin/env python3
"""stowage as PyTorch's allocator against PyTorch's own, each in its own process (the allocator
is chosen before CUDA's first allocation). Prints Markdown tables.

1. A cached pair: `torch.empty(n, dtype=uint8, device='cuda')` and its free, in a loop, under
   PyTorch's CUDACachingAllocator, stowage through the shim (`stowage.torch.enable()`), and
   stowage as the plain CUDAPluggableAllocator. Target: shim <= 1.1x PyTorch.
2. The same pair from 1, 2 and 8 threads at once, made through PyTorch's C++ API
   (bench/torch_threads_pair.cpp, compiled with torch.utils.cpp_extension): pairs a second over all
   threads, each allocator against PyTorch's.
3. Where the shim's extra time is (a diagnosis, pairs only): PyTorch's own allocator and the plain
   pluggable one again, each in a process that has also built and loaded the shim module without
   installing it. If loading alone slows them (a late dlopen's thread-local storage, a second
   libcudart), the gap is the loading's, not the allocator's.
4. Peak reserved over a training-like trace whose sequence length changes every step (activations
   of a transformer block allocated and freed in forward/backward order), against PyTorch with and
   without `expandable_segments:True`. Target: stowage below both.

    python3 bench/torch_allocator_bench.py path/to/libstowage.so
    python3 bench/torch_allocator_bench.py --threads-on-cpu   # the threaded pair on the CPU alone
"""
import json
import os
import subprocess
import sys
import time

SIZES = [512, 64 << 10, 1 << 20, 8 << 20]
PAIRS = 20000
REPEATS = 7
ROUNDS = 5
THREADS = [1, 2, 8]
THREAD_SIZES = [64 << 10, 1 << 20]
THREAD_PAIRS = 50000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = {  # name: (how stowage is enabled, PYTORCH_CUDA_ALLOC_CONF)
    "torch": (None, ""), "torch_expandable": (None, "expandable_segments:True"),
    "stowage_shim": ("required", ""), "stowage_plain": (False, ""),
}
# Diagnosis modes (pairs only): a mode of MODES in a process that has loaded the shim module too.
SHIM_LOADED = {"torch_shim_loaded": "torch", "stowage_plain_shim_loaded": "stowage_plain"}


def enable(mode):
    if mode in SHIM_LOADED:
        import stowage.torch
        stowage.torch.build_shim()  # loaded into the process, never installed
        mode = SHIM_LOADED[mode]
    how = MODES[mode][0]
    if how is None:
        return
    import stowage.torch
    stowage.torch.enable(shim=how)


def pair_times():
    import torch
    result = {}
    for size in SIZES:
        torch.empty(size, dtype=torch.uint8, device="cuda")  # the size is cached from here on
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            for _ in range(PAIRS):
                x = torch.empty(size, dtype=torch.uint8, device="cuda")
                del x
            times.append((time.perf_counter() - t0) / PAIRS * 1e9)
        result[size] = sorted(times)[REPEATS // 2]
    return result


def threads_module():
    """The threaded pair (bench/torch_threads_pair.cpp), built once per torch and cached."""
    import hashlib
    import torch
    from torch.utils import cpp_extension
    source = os.path.join(ROOT, "bench", "torch_threads_pair.cpp")
    with open(source, "rb") as f:
        digest = hashlib.sha256(f.read() + torch.__version__.encode()).hexdigest()[:12]
    directory = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "stowage",
                             "bench-threads-pair", digest)
    os.makedirs(directory, exist_ok=True)
    return cpp_extension.load(name=f"stowage_bench_threads_pair_{digest}", sources=[source],
                              extra_cflags=["-O2"], build_directory=directory, verbose=False)


def thread_pairs(device):
    """Pairs a second over all threads, by thread count and size."""
    module = threads_module()
    return {threads: {size: module.pairs_per_second(size, threads, THREAD_PAIRS // threads, device)
                      for size in THREAD_SIZES} for threads in THREADS}


def trace_peak(mode):
    """Forward keeps each layer's activations, backward frees them in reverse; the sequence
    length changes every step, so blocks of the last step rarely fit the next one exactly."""
    import torch
    hidden, layers, batch = 4096, 8, 4
    seqs = [512, 2048, 1024, 3072, 768, 4096, 1536, 2560, 640, 3584]
    for seq in seqs:
        kept = []
        for _ in range(layers):
            n = batch * seq * hidden
            kept.append([torch.empty(n * 2, dtype=torch.bfloat16, device="cuda"),   # qkv + attn out
                         torch.empty(n * 4, dtype=torch.bfloat16, device="cuda"),   # mlp up
                         torch.empty(n, dtype=torch.bfloat16, device="cuda")])      # residual
            tmp = torch.empty(batch * 32 * seq * seq // 8, dtype=torch.bfloat16, device="cuda")  # scores
            del tmp
        while kept:
            grads = [torch.empty_like(t) for t in kept[-1]]
            del grads
            kept.pop()
    torch.cuda.synchronize()
    if MODES[mode][0] is None:
        return torch.cuda.max_memory_reserved()
    import stowage.torch
    return stowage.torch.max_memory_reserved()


def child(mode, trace):
    enable(mode)
    if mode in SHIM_LOADED:
        return {"pairs": pair_times(), "threads": {}, "trace_peak": None}
    return {"pairs": pair_times(), "threads": thread_pairs("cuda"),
            "trace_peak": trace_peak(mode) if trace else None}


def size_label(size):
    return f"{size >> 20} MiB" if size >= 1 << 20 else (f"{size >> 10} KiB" if size >= 1 << 10 else f"{size} B")


def threads_on_cpu():
    """The threaded pair through PyTorch's CPU allocator: checks the extension builds and runs
    where there is no GPU (it measures glibc's malloc under PyTorch, not stowage)."""
    result = thread_pairs("cpu")
    print("| threads | " + " | ".join(f"{size_label(s)} pairs/s" for s in THREAD_SIZES) + " |")
    print("|---:|" + "---:|" * len(THREAD_SIZES))
    for threads in THREADS:
        print(f"| {threads} | " + " | ".join(f"{result[threads][s] / 1e6:.2f} M" for s in THREAD_SIZES) + " |")
    return 0


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        print("RESULT " + json.dumps(child(sys.argv[2], sys.argv[3] == "trace")))
        return 0
    if len(sys.argv) == 2 and sys.argv[1] == "--threads-on-cpu":
        return threads_on_cpu()
    try:
        import torch
    except ImportError:
        print("skipped: PyTorch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("skipped: no CUDA GPU visible to PyTorch")
        return 0
    threads_module()  # built here once, before the children load it
    env = dict(os.environ, STOWAGE_LIBRARY=os.path.abspath(sys.argv[1]),
               PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # The modes take turns, ROUNDS times, each run a fresh process: a pair's time is the median over
    # the rounds of each run's median, so one slow process (placement, clocks) does not decide it.
    runs = {mode: [] for mode in (*MODES, *SHIM_LOADED)}
    thread_runs = {mode: [] for mode in runs}
    trace = {}
    for round_ in range(ROUNDS):
        for mode in runs:
            conf = MODES[SHIM_LOADED.get(mode, mode)][1]
            what = "trace" if round_ == 0 else "pairs"
            run = subprocess.run([sys.executable, __file__, "--child", mode, what], capture_output=True, text=True,
                                 env=dict(env, PYTORCH_CUDA_ALLOC_CONF=conf))
            lines = [l for l in run.stdout.splitlines() if l.startswith("RESULT ")]
            if run.returncode != 0 or not lines:
                print(f"{mode} run failed (exit {run.returncode}):\n{run.stdout}\n{run.stderr}")
                return 1
            r = json.loads(lines[-1][len("RESULT "):])
            runs[mode].append({int(k): v for k, v in r["pairs"].items()})
            thread_runs[mode].append({int(t): {int(k): v for k, v in by_size.items()}
                                      for t, by_size in r["threads"].items()})
            if r["trace_peak"] is not None:
                trace[mode] = r["trace_peak"]
    def median_over_rounds(values):
        return sorted(values)[ROUNDS // 2]

    results = {mode: {"pairs": {size: median_over_rounds(run[size] for run in runs[mode]) for size in SIZES},
                      "threads": {t: {size: median_over_rounds(run[t][size] for run in thread_runs[mode])
                                      for size in THREAD_SIZES} for t in THREADS},
                      "trace_peak": trace[mode]} for mode in MODES}
    libc = " ".join(os.confstr("CS_GNU_LIBC_VERSION").split()) if "CS_GNU_LIBC_VERSION" in os.confstr_names else "?"
    print(f"GPU: {torch.cuda.get_device_name(0)}; PyTorch {torch.__version__}; {libc}; median over {ROUNDS} "
          f"interleaved processes of the median of {REPEATS} x {PAIRS} pairs\n")
    print("| size | PyTorch ns/pair | stowage shim ns/pair | shim / PyTorch | stowage plain ns/pair | plain / PyTorch |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size in SIZES:
        t = results["torch"]["pairs"][size]
        s = results["stowage_shim"]["pairs"][size]
        p = results["stowage_plain"]["pairs"][size]
        print(f"| {size_label(size)} | {t:.0f} | {s:.0f} | {s / t:.2f}x | {p:.0f} | {p / t:.2f}x |")
    loaded = {mode: {size: median_over_rounds(run[size] for run in runs[mode]) for size in SIZES}
              for mode in SHIM_LOADED}
    print("\nThe same pair in processes that also loaded the shim module without installing it (where the "
          "shim's extra time is: loading it, or running it):\n")
    print("| size | PyTorch, shim loaded | / PyTorch | plain, shim loaded | / plain |")
    print("|---:|---:|---:|---:|---:|")
    for size in SIZES:
        t, p = loaded["torch_shim_loaded"][size], loaded["stowage_plain_shim_loaded"][size]
        print(f"| {size_label(size)} | {t:.0f} | {t / results['torch']['pairs'][size]:.2f}x | {p:.0f} | "
              f"{p / results['stowage_plain']['pairs'][size]:.2f}x |")
    print(f"\nPairs from several threads at once through PyTorch's C++ API (`bench/torch_threads_pair.cpp`), "
          f"{THREAD_PAIRS} pairs in all per measurement; {os.cpu_count()} CPUs. Millions of pairs a second over "
          f"all threads (higher is better); the ratios are stowage's time a pair over PyTorch's, as above.\n")
    print("| size | threads | PyTorch M/s | shim M/s | shim / PyTorch | plain M/s | plain / PyTorch |"
          " shim: N threads / 1 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in THREAD_SIZES:
        for t in THREADS:
            r = {mode: results[mode]["threads"][t][size] for mode in ("torch", "stowage_shim", "stowage_plain")}
            scale = r["stowage_shim"] / results["stowage_shim"]["threads"][1][size]
            print(f"| {size_label(size)} | {t} | {r['torch'] / 1e6:.2f} | {r['stowage_shim'] / 1e6:.2f} | "
                  f"{r['torch'] / r['stowage_shim']:.2f}x | {r['stowage_plain'] / 1e6:.2f} | "
                  f"{r['torch'] / r['stowage_plain']:.2f}x | {scale:.2f}x |")
    print("\n| trace (sequence length varies per step) | peak reserved | vs PyTorch | vs PyTorch expandable |")
    print("|---|---:|---:|---:|")
    base, expandable = results["torch"]["trace_peak"], results["torch_expandable"]["trace_peak"]
    for mode in MODES:
        peak = results[mode]["trace_peak"]
        print(f"| {mode} | {peak / 2**30:.2f} GiB | {peak / base:.3f}x | {peak / expandable:.3f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
