#!/usr/bin/env python3
"""One optimizer step of mixed-precision AdamW from PyTorch, on CPU tensors, three ways in one
process (medians of REPEATS steps each, interleaved so load changes hit all three alike):

- stowage: SharedStorageAdamW, the fused kernel over split storage through the C ABI (4 B/param
  of weights, the bf16 weights are the planes themselves);
- torch AdamW + copy: torch.optim.AdamW (its default implementation) on fp32 masters, then each
  master copied into its bf16 weight, what a plain mixed-precision loop does (6 B/param);
- reference: stowage.torch.reference.MasterWeightsOptimizer, AdamW as one PyTorch operation per
  line of the fused kernels' order (bit-identical to stowage; 6 B/param).

Prints a Markdown table: ms per step and each against stowage.

    PYTHONPATH=python STOWAGE_LIBRARY=build/libstowage.so python3 bench/torch_optimizer_bench.py [params_millions [tensors]]

Many small tensors (say 0.0384 150: 150 tensors of 256) measure what each optimizer costs per
tensor beyond the arithmetic: calls, checks and bookkeeping.
"""
import statistics
import sys
import time

import torch

from stowage.torch.optim import SharedStorageAdamW
from stowage.torch.reference import MasterWeightsOptimizer

REPEATS = 15
TENSORS = int(sys.argv[2]) if len(sys.argv) > 2 else 8


def params(total):
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(total // TENSORS)) for _ in range(TENSORS)]


def main():
    total = int(float(sys.argv[1]) * 1e6) if len(sys.argv) > 1 else 16_000_000
    grads = [torch.randn(total // TENSORS).to(torch.bfloat16) for _ in range(TENSORS)]

    ours = params(total)
    fused = SharedStorageAdamW(ours, lr=1e-4, weight_decay=0.01)
    masters, weights = params(total), [p.detach().to(torch.bfloat16) for p in params(total)]
    plain = torch.optim.AdamW(masters, lr=1e-4, weight_decay=0.01)
    ref_params = params(total)
    ref = MasterWeightsOptimizer(ref_params, lr=1e-4, weight_decay=0.01)

    def step_stowage():
        for p, g in zip(ours, grads):
            p.grad = g
        fused.step()

    def step_plain():
        for p, g in zip(masters, grads):
            p.grad = g.float()  # the fp32 gradient an fp32-master optimizer reads
        plain.step()
        for w, p in zip(weights, masters):
            w.copy_(p)

    def step_reference():
        for p, g in zip(ref_params, grads):
            p.grad = g
        ref.step()

    runs = {"stowage SharedStorageAdamW": step_stowage, "torch AdamW + bf16 copy": step_plain,
            "reference (kernel order)": step_reference}
    times = {name: [] for name in runs}
    for _ in range(REPEATS):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["stowage SharedStorageAdamW"])
    print(f"AdamW step, {total / 1e6:g} M parameters in {TENSORS} tensors, bf16 gradients, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {REPEATS}\n")
    print("| optimizer | weight bytes/param | ms per step | µs per tensor | time vs stowage |")
    print("|---|---:|---:|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        per = 4 + 1 / 8 if name.startswith("stowage") else 6
        print(f"| {name} | {per:g} | {med * 1e3:.2f} | {med / TENSORS * 1e6:.1f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
