#!/usr/bin/env python3
"""A cached alloc+free pair through PyTorch's allocator interface: PyTorch's own
CUDACachingAllocator against libstowage.so loaded as its CUDAPluggableAllocator.

Both run the same Python loop over torch.cuda.caching_allocator_alloc / caching_allocator_delete
(the binding to the current allocator's raw_alloc / raw_delete), each in its own process (the
allocator is chosen before CUDA's first allocation), so both carry the same binding overhead; a
loop of an empty ctypes call gives that overhead's order. Prints a Markdown table.

    python3 bench/torch_allocator_bench.py path/to/libstowage.so
"""
import json
import subprocess
import sys
import time

SIZES = [512, 64 << 10, 1 << 20, 8 << 20]
PAIRS = 20000
REPEATS = 7


def child(use_stowage, library):
    import torch

    if use_stowage:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(library, "stowage_malloc", "stowage_free")
        torch.cuda.memory.change_current_allocator(allocator)
    stream = torch.cuda.current_stream().cuda_stream
    alloc, free = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
    result = {}
    for size in SIZES:
        free(alloc(size, 0, stream))  # the size is cached from here on
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            for _ in range(PAIRS):
                free(alloc(size, 0, stream))
            times.append((time.perf_counter() - t0) / PAIRS * 1e9)
        result[size] = sorted(times)[REPEATS // 2]
    return result


def call_overhead_ns():
    import ctypes

    noop = ctypes.CDLL(None).getpid
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(PAIRS):
            noop()
            noop()
        times.append((time.perf_counter() - t0) / PAIRS * 1e9)
    return sorted(times)[REPEATS // 2]


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        print("RESULT " + json.dumps(child(sys.argv[2] == "stowage", sys.argv[3] if len(sys.argv) > 3 else "")))
        return 0
    try:
        import torch
    except ImportError:
        print("skipped: PyTorch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("skipped: no CUDA GPU visible to PyTorch")
        return 0
    library = sys.argv[1]
    results = {}
    for name in ("torch", "stowage"):
        run = subprocess.run([sys.executable, __file__, "--child", name, library], capture_output=True, text=True)
        lines = [l for l in run.stdout.splitlines() if l.startswith("RESULT ")]
        if run.returncode != 0 or not lines:
            print(f"{name} run failed (exit {run.returncode}):\n{run.stdout}\n{run.stderr}")
            return 1
        results[name] = {int(k): v for k, v in json.loads(lines[-1][len("RESULT "):]).items()}
    print(f"GPU: {torch.cuda.get_device_name(0)}; PyTorch {torch.__version__}; median of {REPEATS} x {PAIRS} pairs")
    print(f"two empty ctypes calls from the same loop: {call_overhead_ns():.0f} ns\n")
    print("| size | PyTorch CUDACachingAllocator ns/pair | stowage (pluggable) ns/pair | stowage / PyTorch |")
    print("|---:|---:|---:|---:|")
    for size in SIZES:
        t, s = results["torch"][size], results["stowage"][size]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else (f"{size >> 10} KiB" if size >= 1 << 10 else f"{size} B")
        print(f"| {label} | {t:.0f} | {s:.0f} | {s / t:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
