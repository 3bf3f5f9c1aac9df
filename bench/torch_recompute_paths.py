#!/usr/bin/env python3
"""What recomputation costs in a whole forward and backward, by path: one residual MLP layer
(fc1, activation, fc2) trained plain, with recompute_activations taking the in-place path (nn.GELU,
gpt.SwiGLU through the recompute protocol: the output computed straight into its released storage,
backward with no rerun graph), and with the general path (the same arithmetic in a module class
stowage does not know: a rerun with a graph and a copy). The three take turns, so drift on a
shared machine hits them alike; each time is the median of the rounds. Prints a Markdown table.

    python3 bench/torch_recompute_paths.py [--device cpu|cuda] [--hidden 256,512,1024] [--tokens 2048]
                                           [--dtype float32|bfloat16] [--rounds 30] [--json FILE]

Also, without the matmuls, what each path adds by itself for one activation of tokens x ffn: the
restore (in place: the activation written into the storage; general: the rerun with its graph and
the copy) plus the activation's backward (in place: the backward kernels on the saved input;
general: autograd through the rerun's graph), against the plain activation's own backward.
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from stowage.torch import gpt  # noqa: E402
from stowage.torch.recompute import recompute_activations  # noqa: E402


class GeneralGelu(nn.Module):
    """nn.GELU's arithmetic in a class stowage does not know: the general path."""

    def forward(self, x):
        return nn.functional.gelu(x)


class GeneralSwiGLU(nn.Module):
    """gpt.SwiGLU's forward without the recompute protocol: the general path."""

    def forward(self, x):
        gate, up = x.chunk(2, dim=-1)
        return nn.functional.silu(gate) * up


class Layer(nn.Module):
    def __init__(self, hidden, ffn, act, gated):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 2 * ffn if gated else ffn)
        self.act = act
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(x)))


def models(hidden, kind, device, dtype):
    gated = kind == "swiglu"
    known, general = (gpt.SwiGLU, GeneralSwiGLU) if gated else (nn.GELU, GeneralGelu)
    torch.manual_seed(0)
    plain = Layer(hidden, 4 * hidden, known(), gated).to(device=device, dtype=dtype)
    in_place = copy.deepcopy(plain)
    recompute_activations(in_place, activation_types=(known,))
    rerun = copy.deepcopy(plain)
    rerun.act = general()
    recompute_activations(rerun, activation_types=(general,))
    return {"plain": plain, "in_place": in_place, "general": rerun}


def measure(hidden, kind, args, device, dtype):
    x = torch.randn(args.tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    runs = models(hidden, kind, device, dtype)
    times = {name: [] for name in runs}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for round_ in range(args.rounds + 3):  # three warm-up rounds
        for name, model in runs.items():
            sync()
            t0 = time.perf_counter()
            model(x).backward(grad)
            sync()
            if round_ >= 3:
                times[name].append((time.perf_counter() - t0) * 1e3)
    med = {name: statistics.median(t) for name, t in times.items()}
    grads = {name: [p.grad for p in m.parameters()] for name, m in runs.items()}
    same = all(torch.equal(a, b) for name in ("in_place", "general") for a, b in zip(grads["plain"], grads[name]))
    return {"plain_ms": med["plain"], "in_place_ms": med["in_place"], "general_ms": med["general"],
            "same_gradients": same}


def activation_only(hidden, kind, args, device, dtype):
    """ms of: the plain activation's backward; each path's restore + backward of one activation."""
    from stowage.torch._known_activations import known_activation
    gated = kind == "swiglu"
    ffn = 4 * hidden
    known_act, general_act = (gpt.SwiGLU(), GeneralSwiGLU()) if gated else (nn.GELU(), GeneralGelu())
    x = torch.randn(args.tokens, 2 * ffn if gated else ffn, device=device, dtype=dtype)
    grad = torch.randn(args.tokens, ffn, device=device, dtype=dtype)
    out = torch.empty(args.tokens, ffn, device=device, dtype=dtype)
    known = known_activation(known_act.forward, (x,))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def plain():
        leaf = x.detach().requires_grad_()
        y = known_act(leaf)
        sync()
        t0 = time.perf_counter()
        y.backward(grad)
        sync()
        return time.perf_counter() - t0

    def in_place():
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            kept = known.into(out, x)
        known.backward(grad, kept, x)
        sync()
        return time.perf_counter() - t0

    def general():
        sync()
        t0 = time.perf_counter()
        leaf = x.detach().requires_grad_()
        y = general_act(leaf)
        with torch.no_grad():
            out.copy_(y)
        torch.autograd.backward(y, grad)
        sync()
        return time.perf_counter() - t0

    times = {"plain": [], "in_place": [], "general": []}
    for round_ in range(args.rounds + 3):
        for name, fn in (("plain", plain), ("in_place", in_place), ("general", general)):
            t = fn()
            if round_ >= 3:
                times[name].append(t * 1e3)
    return {f"{name}_ms": statistics.median(t) for name, t in times.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hidden", type=lambda v: [int(h) for h in v.split(",") if h], default=[256, 512, 1024])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--activation-only", action="store_true", help="only the activation's own costs (no layer)")
    args = ap.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if device.type == "cuda":
        torch.backends.cudnn.deterministic = True
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    alone = {f"{kind}, ffn {4 * h}": activation_only(h, kind, args, device, dtype)
             for kind in ("gelu", "swiglu") for h in args.hidden}
    print(f"{name}; PyTorch {torch.__version__}; {args.dtype}; one activation of {args.tokens} tokens; median of "
          f"{args.rounds} interleaved rounds\n")
    print("| activation | plain backward ms | in place: restore + backward ms | general: restore + backward ms |"
          " in place / general |")
    print("|---|---:|---:|---:|---:|")
    for key, r in alone.items():
        print(f"| {key} | {r['plain_ms']:.3f} | {r['in_place_ms']:.3f} | {r['general_ms']:.3f} | "
              f"{r['in_place_ms'] / r['general_ms']:.2f}x |")
    print()
    if args.activation_only:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": name, "torch": torch.__version__, "dtype": args.dtype, "tokens": args.tokens,
                           "activation_only": alone}, f, indent=1)
        return 0
    results = {f"{kind}, hidden {h}": measure(h, kind, args, device, dtype)
               for kind in ("gelu", "swiglu") for h in args.hidden}
    print(f"{name}; PyTorch {torch.__version__}; {args.dtype}; {args.tokens} tokens, ffn 4 x hidden; median of "
          f"{args.rounds} interleaved rounds of one forward + backward\n")
    print("| layer | plain ms | in place / plain | general / plain | gradients equal |")
    print("|---|---:|---:|---:|---|")
    for key, r in results.items():
        print(f"| {key} | {r['plain_ms']:.3f} | {r['in_place_ms'] / r['plain_ms']:.3f}x | "
              f"{r['general_ms'] / r['plain_ms']:.3f}x | {'yes' if r['same_gradients'] else 'NO'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "dtype": args.dtype, "tokens": args.tokens,
                       "activation_only": alone, "results": results}, f, indent=1)
    return 0 if all(r["same_gradients"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
