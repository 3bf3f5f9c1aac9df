"""`python3 -m stowage.torch.demo`: the small GPT (stowage.torch.gpt) trained with each
configuration of stowage's PyTorch techniques against plain PyTorch, on the CPU.

baseline   plain PyTorch: fp32 master weights, a bf16 copy for compute, AdamW in the fused
           kernels' operation order (stowage.torch.reference)
shared     SharedStorageAdamW: the bf16 weights are the high half of the master (nearest-even)
recompute  the baseline with activation outputs released after forward, recomputed in backward
all        shared + recompute

For each: the loss trajectory (bit-identical to the baseline's or not), the bytes of weights,
optimizer state and saved activations live at the last step's forward/backward boundary, and
what the technique was predicted to save (the formulas of `stowage estimate`: 2 bytes per
parameter less the tie bitmap; the activation output of each MLP, b x s x ffn x 2 bytes).
"""
import argparse
import json
import sys

import torch

from . import gpt
from .adaptor import apply
from .reference import MasterWeightsOptimizer

CONFIGS = ("baseline", "shared", "recompute", "all")


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


def run(config, steps=8, seq=32, batch=4, layers=2, hidden=64, ffn=256, lr=3e-3, seed=0):
    """Trains one configuration; returns a dict of its losses and measured bytes."""
    if config not in CONFIGS:
        raise ValueError(f"config {config!r} is not one of {', '.join(CONFIGS)}")
    data, vocab = gpt.batches(gpt.corpus(), seq, batch, steps, seed=seed + 1)
    torch.manual_seed(seed)
    model = gpt.GPT(vocab, seq, hidden=hidden, layers=layers, ffn=ffn)
    params = sum(p.numel() for p in model.parameters())
    shared, recompute = config in ("shared", "all"), config in ("recompute", "all")
    if shared:
        applied = apply(model, torch.optim.AdamW(model.parameters(), lr=lr), recompute=recompute,
                        recompute_activation_types=(torch.nn.GELU, gpt.SwiGLU))
        opt = applied.optimizer
    else:
        opt = MasterWeightsOptimizer(model.parameters(), lr=lr)
        applied = apply(model, torch.optim.AdamW(model.parameters(), lr=lr), shared_storage=False,
                        recompute=recompute, recompute_activation_types=(torch.nn.GELU, gpt.SwiGLU))
    losses, saved = [], 0
    for x, y in data:
        opt.zero_grad()
        meter = SavedBytes(model.parameters())
        with meter.hooks():
            logits = model(x)
        saved = meter.bytes()  # the forward/backward boundary
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    state = opt.m + opt.v if isinstance(opt, MasterWeightsOptimizer) else [
        t for s in opt.state.values() for k, t in s.items() if k in ("exp_avg", "exp_avg_sq")]
    result = {
        "config": config,
        "losses": losses,
        "parameters": params,
        "weight_bytes": opt.storage_bytes(),
        "optimizer_state_bytes": sum(t.numel() * t.element_size() for t in state),
        "saved_activation_bytes": saved,
        "predicted_saving_bytes": (2 * params - (params + 7) // 8 if shared else 0) +
                                  (layers * batch * seq * ffn * 2 if recompute else 0),
    }
    result["boundary_bytes"] = result["weight_bytes"] + result["optimizer_state_bytes"] + saved
    applied.remove()
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m stowage.torch.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="JSON output (schema stowage.torch.demo/1)")
    args = ap.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    if args.steps < 1 or args.layers < 1:
        ap.error("--steps and --layers must be at least 1")
    results = [run(c, steps=args.steps, layers=args.layers) for c in configs]
    base = next((r for r in results if r["config"] == "baseline"), None)
    for r in results:
        r["same_losses_as_baseline"] = None if base is None else r["losses"] == base["losses"]
        r["measured_saving_bytes"] = None if base is None else base["boundary_bytes"] - r["boundary_bytes"]
    if args.json:
        json.dump({"schema": "stowage.torch.demo/1", "results": results}, sys.stdout, indent=2)
        print()
        return 0
    print(f"{'config':<10} {'final loss':>11} {'same losses':>11} {'weights':>9} {'opt state':>9} "
          f"{'saved act':>9} {'boundary':>9} {'saved':>9} {'predicted':>9}")
    for r in results:
        same = "-" if r["same_losses_as_baseline"] is None else ("yes" if r["same_losses_as_baseline"] else "NO")
        print(f"{r['config']:<10} {r['losses'][-1]:>11.6f} {same:>11} {r['weight_bytes']:>9} "
              f"{r['optimizer_state_bytes']:>9} {r['saved_activation_bytes']:>9} {r['boundary_bytes']:>9} "
              f"{r['measured_saving_bytes'] if r['measured_saving_bytes'] is not None else '-':>9} "
              f"{r['predicted_saving_bytes']:>9}")
    print("bytes live at the last step's forward/backward boundary; 'saved' = baseline minus this config")
    return 0


if __name__ == "__main__":
    sys.exit(main())
