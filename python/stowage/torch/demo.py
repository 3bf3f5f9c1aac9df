"""`python3 -m stowage.torch.demo`: the small GPT (stowage.torch.gpt) trained with each
configuration of stowage's PyTorch techniques against plain PyTorch, on the CPU. Host memory is
stowage's emulated device; with a libstowage using CUDA, swap and offload keep their host copies in
PyTorch's CPU memory, and the demo measures no saving from them there.

baseline   plain PyTorch: fp32 master weights, a bf16 copy for compute, AdamW in the fused
           kernels' operation order (stowage.torch.reference)
shared     SharedStorageAdamW: the bf16 weights are the high half of the master (nearest-even)
recompute  the baseline with activation outputs released after forward, recomputed in backward
swap       the baseline with what attention saves for backward moved to host memory (prefetch 1)
offload    shared, with AdamW's m and v in host memory (mapped; --offload-budget keeps some)
all        shared + recompute + swap + offload

For each: the loss trajectory (bit-identical to the baseline's or not), the bytes of weights,
optimizer state and saved activations live in PyTorch's memory (the device's, on a GPU) at the last
step's forward/backward boundary, the bytes moved to host memory (stowage's, on the CPU), and what
each technique was predicted to save (the formulas of `stowage estimate`: 2 bytes per parameter
less the tie bitmap; the activation output of each MLP, b x s x ffn x 2 bytes; the attention
activations of the layers outside the prefetch window, b x s x (14 h + 2 heads s) bytes each; 8
bytes of AdamW state per parameter, less what the budget keeps on the device).
"""
import argparse
import json
import sys

import torch

from .. import memory
from ..errors import InvalidArgumentError
from . import gpt
from .adaptor import apply
from .reference import MasterWeightsOptimizer

CONFIGS = ("baseline", "shared", "recompute", "swap", "offload", "all")
TECHNIQUES = {"baseline": (), "shared": ("shared_storage",), "recompute": ("act_fn_recompute",),
              "swap": ("swap_attention",), "offload": ("shared_storage", "optimizer_offload"),
              "all": ("shared_storage", "act_fn_recompute", "swap_attention", "optimizer_offload")}


class SavedBytes:
    """Bytes of the distinct storages autograd saved for backward, as they are now (a released
    storage counts 0), less the parameters' own storages."""

    def __init__(self, exclude):
        self.exclude = {self._ptr(t) for t in exclude}
        self.saved = []

    @staticmethod
    def _storage(t):
        return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()

    def _ptr(self, t):
        return self._storage(t).data_ptr()

    def hooks(self):
        def pack(t):
            self.saved.append(t)
            return t
        return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

    def bytes(self):
        seen = {}
        for t in self.saved:
            s = self._storage(t)
            ptr = s.data_ptr()
            if ptr not in self.exclude and s.nbytes() > 0:
                seen[ptr] = s.nbytes()
        return sum(seen.values())


def predictions(model, batch, seq, prefetch=1, offload_budget=None):
    """What `stowage estimate` predicts each technique saves on this model, in bytes."""
    params = sum(p.numel() for p in model.parameters())
    layers, hidden = len(model.blocks), model.norm.weight.numel()
    heads, ffn = model.blocks[0].attn.heads, model.blocks[0].mlp.fc2.in_features
    return {
        "shared_storage": 2 * params - (params + 7) // 8,  # the bf16 copy, less the tie bitmap
        "act_fn_recompute": layers * batch * seq * ffn * 2,
        # tools/estimate/memory_model.cpp for MHA without dropout or flash attention: norm and QKV
        # inputs, Q, K, V, projection input, second norm input (14 h per token) and the softmax.
        "swap_attention": max(0, layers - prefetch) * batch * seq * (14 * hidden + 2 * heads * seq),
        "optimizer_offload": max(0, 8 * params - (offload_budget or 0)),
    }


def _in_stowage(t, blocks):
    return any(a <= t.data_ptr() < a + size for a, size in blocks)


def _state_bytes(opt):
    """(bytes in PyTorch's memory, bytes in stowage's) of the optimizer's m and v, told apart by
    the blocks stowage's allocator has handed out."""
    if isinstance(opt, MasterWeightsOptimizer):
        return sum(t.numel() * t.element_size() for t in opt.m + opt.v), 0
    blocks = [(b["address"], b["size"]) for s in memory.snapshot(0)["segments"] for b in s["blocks"]
              if b["state"] == "active_allocated"] if not memory.using_cuda() else []
    state = [t for s in opt.state.values() for k, t in s.items() if k in ("exp_avg", "exp_avg_sq")]
    host = sum(t.numel() * t.element_size() for t in state if _in_stowage(t, blocks))
    return sum(t.numel() * t.element_size() for t in state) - host, host


def run(config, steps=8, seq=32, batch=4, layers=2, hidden=64, ffn=256, lr=3e-3, seed=0, prefetch=1,
        offload_budget=None):
    """Trains one configuration; returns a dict of its losses and measured bytes."""
    if config not in CONFIGS:
        raise InvalidArgumentError(f"config {config!r} is not one of {', '.join(CONFIGS)}")
    data, vocab = gpt.batches(gpt.corpus(), seq, batch, steps, seed=seed + 1)
    torch.manual_seed(seed)
    model = gpt.GPT(vocab, seq, hidden=hidden, layers=layers, ffn=ffn)
    params = sum(p.numel() for p in model.parameters())
    techniques = TECHNIQUES[config]
    shared = "shared_storage" in techniques
    options = dict(recompute="act_fn_recompute" in techniques, recompute_activation_types=(torch.nn.GELU, gpt.SwiGLU),
                   swap="swap_attention" in techniques, swap_prefetch=prefetch)
    if "optimizer_offload" in techniques:
        options.update(state_offload="mapped", state_device_budget=offload_budget)
    predicted = {k: v for k, v in predictions(model, batch, seq, prefetch, offload_budget).items() if k in techniques}
    if shared:
        applied = apply(model, torch.optim.AdamW(model.parameters(), lr=lr), **options)
        opt = applied.optimizer
    else:
        opt = MasterWeightsOptimizer(model.parameters(), lr=lr)
        applied = apply(model, torch.optim.AdamW(model.parameters(), lr=lr), shared_storage=False, **options)
    losses, saved, swapped = [], 0, 0
    for x, y in data:
        opt.zero_grad()
        meter = SavedBytes(model.parameters())
        if applied.swap is not None:
            applied.swap.stats.reset()
        with meter.hooks():
            logits = model(x)
        saved = meter.bytes()  # the forward/backward boundary
        swapped = applied.swap.stats.bytes_to_host if applied.swap is not None else 0
        if memory.using_cuda():  # stowage's memory is a GPU's: swap kept its copies in PyTorch's CPU memory
            saved += swapped
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    state, offloaded = _state_bytes(opt)
    result = {
        "config": config,
        "losses": losses,
        "parameters": params,
        "weight_bytes": opt.storage_bytes(),
        "optimizer_state_bytes": state,
        "saved_activation_bytes": saved,
        "offloaded_state_bytes": offloaded,
        "swapped_activation_bytes": swapped,
        "predicted_saving_bytes": sum(predicted.values()),
        "predicted_saving_by_technique": predicted,
    }
    result["boundary_bytes"] = result["weight_bytes"] + result["optimizer_state_bytes"] + saved
    applied.remove()
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m stowage.torch.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--offload-budget", type=int, default=None, metavar="BYTES",
                    help="offload: bytes of AdamW state kept in device memory (default: none kept)")
    ap.add_argument("--json", action="store_true", help="JSON output (schema stowage.torch.demo/1)")
    args = ap.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or not configs:
        ap.error(f"--configs: {', '.join(unknown) or 'none given'}; choose from {', '.join(CONFIGS)}")
    if args.steps < 1 or args.layers < 1:
        ap.error("--steps and --layers must be at least 1")
    if args.offload_budget is not None and args.offload_budget < 0:
        ap.error("--offload-budget must be at least 0")
    results = [run(c, steps=args.steps, layers=args.layers, offload_budget=args.offload_budget) for c in configs]
    base = next((r for r in results if r["config"] == "baseline"), None)
    for r in results:
        r["same_losses_as_baseline"] = None if base is None else r["losses"] == base["losses"]
        r["measured_saving_bytes"] = None if base is None else base["boundary_bytes"] - r["boundary_bytes"]
    if args.json:
        json.dump({"schema": "stowage.torch.demo/1", "results": results}, sys.stdout, indent=2)
        print()
        return 0
    print(f"{'config':<10} {'final loss':>11} {'same losses':>11} {'weights':>9} {'opt state':>9} "
          f"{'saved act':>9} {'boundary':>9} {'saved':>9} {'predicted':>9} {'on host':>9}")
    for r in results:
        same = "-" if r["same_losses_as_baseline"] is None else ("yes" if r["same_losses_as_baseline"] else "NO")
        print(f"{r['config']:<10} {r['losses'][-1]:>11.6f} {same:>11} {r['weight_bytes']:>9} "
              f"{r['optimizer_state_bytes']:>9} {r['saved_activation_bytes']:>9} {r['boundary_bytes']:>9} "
              f"{r['measured_saving_bytes'] if r['measured_saving_bytes'] is not None else '-':>9} "
              f"{r['predicted_saving_bytes']:>9} {r['offloaded_state_bytes'] + r['swapped_activation_bytes']:>9}")
    print("bytes live in PyTorch's memory at the last step's forward/backward boundary; 'saved' = baseline minus "
          "this config; 'on host': offloaded state and swapped activations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
