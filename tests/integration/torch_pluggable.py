#!/usr/bin/env python3
"""libstowage.so as PyTorch's CUDA allocator, against PyTorch's own caching allocator.

Loads the library through torch.cuda.memory.CUDAPluggableAllocator(path, "stowage_malloc",
"stowage_free"), trains a few steps of a small transformer, and compares peak reserved memory
and the final loss with the same training under PyTorch's allocator. Each allocator runs in its
own subprocess (the allocator can only be chosen before CUDA's first allocation).

    python3 tests/integration/torch_pluggable.py [path/to/libstowage.so]

Exits 0 with "skipped: ..." when PyTorch or a GPU is missing; 1 when the runs disagree.
"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_LIBRARY = os.path.join(HERE, "..", "..", "build", "libstowage.so")
STEPS = 8


def train(use_stowage, library):
    import ctypes
    import torch

    stowage = None
    if use_stowage:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(library, "stowage_malloc", "stowage_free")
        torch.cuda.memory.change_current_allocator(allocator)
        # The same path dlopen'ed again is the same library instance: its stats are the allocator's.
        stowage = ctypes.CDLL(library)
        stowage.stowage_get_stats.restype = ctypes.c_ssize_t
        stowage.stowage_get_stats.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        stowage.stowage_last_error.restype = ctypes.c_char_p

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.device("cuda", 0)
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=6).to(device)
    head = torch.nn.Linear(512, 1000).to(device)
    params = list(model.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    data = torch.randn(16, 256, 512, device=device)
    target = torch.randint(0, 1000, (16, 256), device=device)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        logits = head(model(data))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 1000), target.reshape(-1))
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / STEPS

    if stowage is not None:
        n = stowage.stowage_get_stats(0, None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        if n < 0 or stowage.stowage_get_stats(0, buf, n + 1) != n:
            raise RuntimeError(stowage.stowage_last_error().decode())
        stats = json.loads(buf.value.decode())
        reserved, allocated = stats["reserved_bytes.all.peak"], stats["allocated_bytes.all.peak"]
    else:
        reserved, allocated = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
    return {"reserved": reserved, "allocated": allocated, "loss": loss.item(), "step_ms": seconds * 1e3,
            "gpu": torch.cuda.get_device_name(0)}


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        result = train(sys.argv[2] == "stowage", sys.argv[3] if len(sys.argv) > 3 else "")
        print("RESULT " + json.dumps(result))
        return 0

    library = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_LIBRARY)
    try:
        import torch
    except ImportError:
        print("skipped: PyTorch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("skipped: no CUDA GPU visible to PyTorch")
        return 0
    if not os.path.exists(library):
        print(f"error: {library} does not exist (build libstowage first)")
        return 1

    results = {}
    for name in ("torch", "stowage"):
        run = subprocess.run([sys.executable, __file__, "--child", name, library], capture_output=True, text=True)
        lines = [l for l in run.stdout.splitlines() if l.startswith("RESULT ")]
        if run.returncode != 0 or not lines:
            print(f"{name} run failed (exit {run.returncode}):\n{run.stdout}\n{run.stderr}")
            return 1
        results[name] = json.loads(lines[-1][len("RESULT "):])

    mib = 1 << 20
    print(f"GPU: {results['torch']['gpu']}, {STEPS} steps of a 6-layer d=512 transformer, batch 16 x 256")
    print("| allocator | peak reserved MiB | peak allocated MiB | reserved/allocated | step ms | final loss |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        label = "PyTorch CUDACachingAllocator" if name == "torch" else "stowage (CUDAPluggableAllocator)"
        print(f"| {label} | {r['reserved'] / mib:.1f} | {r['allocated'] / mib:.1f} | "
              f"{r['reserved'] / max(r['allocated'], 1):.3f} | {r['step_ms']:.1f} | {r['loss']:.6f} |")
    ratio = results["stowage"]["reserved"] / results["torch"]["reserved"]
    print(f"stowage peak reserved / PyTorch peak reserved = {ratio:.3f}")
    if abs(results["stowage"]["loss"] - results["torch"]["loss"]) > 1e-4 * max(1.0, abs(results["torch"]["loss"])):
        print("FAIL: the allocator changed the numbers")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
