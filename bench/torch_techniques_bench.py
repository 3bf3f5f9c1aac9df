"""stowage's PyTorch techniques on a GPU: the small GPT (stowage.torch.gpt) at a size that keeps
an H100 busy, trained in each configuration against plain PyTorch in the same process.

    python3 bench/torch_techniques_bench.py [--allocator pytorch|stowage] [--steps 20] [--accumulate 1] [--json FILE]

Configurations (each a fresh model from the same seed, the same batches):
  torch      plain PyTorch mixed precision: the model in bf16, fp32 masters stepped by
             torch.optim.AdamW(fused=True), copied back rounded to nearest even. Time and memory peer.
  reference  the same with stowage.torch.reference.MasterWeightsOptimizer (AdamW one PyTorch
             operation per line of the fused kernels' order). The loss peer of shared and all.
  shared     SharedStorageAdamW (stowage.torch.adaptor.apply): bf16 weights are the masters' high halves.
  offload_mapped    shared, with AdamW's m and v in pinned host memory that the fused kernel reads
                    and writes over the link (state_offload="mapped").
  offload_streamed  shared, with m and v in pinned host memory copied through one device scratch
                    per parameter at each step (state_offload="streamed").
  offload_mapped_overlap  offload_mapped with overlap_update: the update runs on a side stream
                    beside the next step's forward, which waits for it module by module.
  recompute  torch + recompute_activations (GeLU and SwiGLU outputs released, recomputed in backward).
  swap       torch + the attention output swapped (what each attention's output projection saves:
             its input, b x s x hidden bf16) to pinned host memory, prefetch distance 1.
  swap_full  torch + everything attention saves swapped (its s x s scores and probabilities too):
             shows what the link costs when the swapped bytes outgrow the compute that hides them.
  all        shared + recompute + swap.
  torch_again  torch once more, last: the spread between the two is the run's timing noise.

Per configuration: the losses (identical to the peer's or not), the median time of an optimizer
step (its micro-batches' forward and backward, and the update) after two warm-up steps, the device
bytes allocated at the forward/backward boundary (after the queued copies are done) and the peak
allocated over the run, from the allocator in use. A step's time runs from its start to the next
step's, with no device-wide wait between them: the host waits for each micro-batch's loss (as a
loop that logs it does), so it is never more than a micro-batch ahead, and an update that runs
beside the next forward (offload_mapped_overlap) is counted as it runs, not as if it ran alone.
Deterministic settings: CUBLAS_WORKSPACE_CONFIG=:4096:8 and torch.use_deterministic_algorithms.

With recompute among the configurations, also the recompute's own cost against its MLP's, measured
in isolation with the model's shapes in bf16, per layer: the MLP's forward and backward (fc1,
activation, fc2) against what one recompute runs, for a GeLU and a SwiGLU layer: both (nn.GELU, and gpt.SwiGLU
through the recompute protocol) are computed straight into the released storage
(stowage.torch._known_activations); any other would be its forward and the copy into the storage. The recompute moves the activation's bytes; the
MLP multiplies matrices, so the share falls as the hidden size grows.
"""
import argparse
import gc
import json
import os
import statistics
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

import torch  # noqa: E402

CONFIGS = ("torch", "reference", "shared", "offload_mapped", "offload_mapped_overlap", "offload_streamed", "recompute",
           "swap", "swap_full", "all", "torch_again")
# Whose losses each must equal. reference and torch differ by design: torch.optim.AdamW(fused=True)
# orders its operations its own way (stowage.torch.reference says how).
LOSS_PEER = {"shared": "reference", "offload_mapped": "reference", "offload_mapped_overlap": "reference",
             "offload_streamed": "reference", "recompute": "torch", "swap": "torch", "swap_full": "torch", "all": "reference",
             "torch_again": "torch"}


class TorchMixedPrecision:
    """fp32 masters stepped by torch.optim.AdamW(fused=True where the device has it); bf16 params."""

    def __init__(self, params, lr):
        self.params = list(params)
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        for p in self.params:
            p.data = p.detach().to(torch.bfloat16)
        fused = self.masters[0].is_cuda
        self.opt = torch.optim.AdamW(self.masters, lr=lr, fused=fused) if fused else torch.optim.AdamW(self.masters, lr=lr)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        for p, m in zip(self.params, self.masters):
            m.grad = p.grad.float()
        self.opt.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                p.copy_(m)
                m.grad = None


class Meter:
    """Bytes allocated now and the peak since reset, from PyTorch's allocator or stowage's."""

    def __init__(self, device, allocator):
        self.cuda = device.type == "cuda"
        self.stowage = allocator == "stowage"
        if self.stowage:
            import stowage.torch as st
            self.st = st

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def allocated(self):
        if not self.cuda:
            return 0
        self.sync()
        return self.st.memory_allocated() if self.stowage else torch.cuda.memory_allocated()

    def reset_peak(self):
        if self.cuda:
            self.sync()
            (self.st.reset_peak_memory_stats if self.stowage else torch.cuda.reset_peak_memory_stats)()

    def peak(self):
        if not self.cuda:
            return 0
        self.sync()
        return self.st.max_memory_allocated() if self.stowage else torch.cuda.max_memory_allocated()

    def counts(self):
        """Device segments the allocator in use has mapped and host-pool blocks pinned so far (each
        a driver call that can stall the streams): a step that made new ones shows here."""
        import stowage.memory as sm
        if not self.cuda:
            return {}
        stats = self.st.memory_stats() if self.stowage else torch.cuda.memory_stats()
        return {"device_segments": stats.get("segment.all.allocated", 0),
                "host_maps": sm.host_stats(torch.cuda.current_device())["num_maps"] if sm.using_cuda() else 0}


def timed_ms(fn, device, reps=20, rounds=5):
    """Median over `rounds` of the mean time of `reps` calls of fn, after three warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(rounds):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / reps)
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            times.append((time.perf_counter() - t0) * 1e3 / reps)
    return statistics.median(times)


def recompute_share(device, args):
    """Per layer kind and hidden size: the MLP's forward + backward ms, one recompute's ms, and
    their ratio. The model's hidden size with its ffn, and each of --recompute-hidden with ffn 4x:
    the recompute moves T x ffn elements, the MLP multiplies T x hidden x ffn, so the share falls as
    1 / hidden."""
    from stowage.torch import gpt
    from stowage.torch._known_activations import known_activation
    out = {}
    sizes = [(args.hidden, args.ffn)] + [(h, 4 * h) for h in args.recompute_hidden if h != args.hidden]
    for (hidden, ffn), (kind, swiglu) in ((size, k) for size in sizes for k in (("gelu", False), ("swiglu", True))):
        torch.manual_seed(0)
        mlp = gpt.MLP(hidden, ffn, swiglu).to(device=device, dtype=torch.bfloat16)
        x = torch.randn(args.batch, args.seq, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
        grad = torch.randn(args.batch, args.seq, hidden, device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            inner = mlp.fc1(x)
            released = torch.empty_like(mlp.act(inner))

        def forward_backward():
            mlp(x).backward(grad)

        known = known_activation(mlp.act.forward, (inner,))

        def recompute():
            with torch.no_grad():
                if known is not None:
                    known.into(released, inner)
                else:
                    released.copy_(mlp.act(inner))

        mlp_ms, recompute_ms = timed_ms(forward_backward, device), timed_ms(recompute, device)
        key = kind if hidden == args.hidden else f"{kind}, hidden {hidden}, ffn {ffn}"
        out[key] = {"mlp_ms": mlp_ms, "recompute_ms": recompute_ms, "share": recompute_ms / mlp_ms,
                    "path": "into" if known is not None else "forward + copy"}
        del mlp, x, grad, inner, released
    return out


def link_gbps(device, mib=256):
    """The host link's GB/s each way, pinned host memory <-> device, median of 5 copies."""
    host = torch.empty(mib << 20, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    h2d = timed_ms(lambda: dev.copy_(host, non_blocking=True), device, reps=1)
    d2h = timed_ms(lambda: host.copy_(dev, non_blocking=True), device, reps=1)
    return {"h2d": (mib << 20) / h2d / 1e6, "d2h": (mib << 20) / d2h / 1e6}


def link_floor(results, link):
    """What mapped or streamed state must cost at least: AdamW reads m and v over the link and
    writes them back once a step, 8 B a parameter each way (the two directions run at once)."""
    params = next(iter(results.values()))["parameters"]
    floor_ms = max(8 * params / (link["h2d"] * 1e9), 8 * params / (link["d2h"] * 1e9)) * 1e3
    torch_ms = results["torch"]["step_ms"] if "torch" in results else None
    return {**link, "floor_ms": floor_ms, "floor_share": floor_ms / torch_ms if torch_ms else None}


def run(config, device, meter, args):
    from stowage.torch import gpt
    from stowage.torch.adaptor import apply
    from stowage.torch.reference import MasterWeightsOptimizer

    data, vocab = gpt.batches(gpt.corpus(), args.seq, args.batch, args.steps * args.accumulate, seed=1)
    data = [(x.to(device), y.to(device)) for x, y in data]
    torch.manual_seed(0)
    model = gpt.GPT(vocab, args.seq, hidden=args.hidden, heads=args.heads, layers=args.layers, ffn=args.ffn).to(device)
    params = sum(p.numel() for p in model.parameters())
    shared = config in ("shared", "all") or config.startswith("offload_")
    offload = config.split("_")[1] if config.startswith("offload_") else "none"
    overlap = config.endswith("_overlap")
    recompute = config in ("recompute", "all")
    swap = config in ("swap", "swap_full", "all")
    outputs = [f"blocks.{i}.attn.proj" for i in range(args.layers)] if config != "swap_full" else []
    adamw = torch.optim.AdamW(model.parameters(), lr=args.lr)
    applied = apply(model, adamw, shared_storage=shared, recompute=recompute,
                    recompute_activation_types=(torch.nn.GELU, gpt.SwiGLU), swap=swap, swap_prefetch=1,
                    swap_names=outputs, state_offload=offload, overlap_update=overlap)
    if shared:
        opt = applied.optimizer
    elif config == "reference":
        opt = MasterWeightsOptimizer(model.parameters(), lr=args.lr)
    else:
        opt = TorchMixedPrecision(model.parameters(), lr=args.lr)
    losses, starts, boundary, counts = [], [], 0, []
    profiled = None
    meter.reset_peak()
    for step in range(args.steps):
        profiling = config in args.profile and step == args.steps - 2  # a timed step, after the warm-up
        opt.zero_grad()
        starts.append(time.perf_counter())  # before the profiler starts: its start-up is in the profiled step only
        if profiling:
            profiled = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + (
                [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []))
            profiled.__enter__()
        for micro in range(args.accumulate):  # gradients accumulate over the micro-batches
            x, y = data[step * args.accumulate + micro]
            logits = model(x)
            if step == args.steps - 1 and micro == 0:
                boundary = meter.allocated()  # synchronizes: the last step is left out of the times
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
            loss.backward()
            losses.append(loss.item())  # synchronizes
        opt.step()
        if profiling:
            meter.sync()
            profiled.__exit__(None, None, None)
            profiled_ms = 1e3 * (time.perf_counter() - starts[-1])
        counts.append(meter.counts())
    peak = meter.peak()
    # Steps 2 to steps - 2, each from its start to the next one's (the last step measures the
    # boundary, which waits for the device; the profiled one is left out).
    times = [starts[k + 1] - starts[k] for k in range(2, args.steps - 1)
             if not (config in args.profile and k == args.steps - 2)]
    if profiled is not None:
        sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        print(f"== profile of one step of {config} (wall {profiled_ms:.2f} ms with the profiler)")
        print(profiled.key_averages().table(sort_by=sort, row_limit=args.profile_rows))
    stats = applied.swap.stats if applied.swap is not None else None
    copy_ms, wait_ms, overlap = ((stats.d2h_ms + stats.h2d_ms, stats.compute_wait_ms, stats.overlap_fraction) if stats
                                 else (0.0, 0.0, None))
    hook_ms = stats.hook_ms if stats else 0.0
    applied.remove()
    del model, opt, applied, adamw, data
    return {
        "config": config,
        "parameters": params,
        "losses": losses,
        "step_ms": 1e3 * statistics.median(times) if times else None,
        "step_ms_all": [1e3 * t for t in times],
        "counts_after_step": counts,  # allocator segments and host-pool maps, cumulative
        "boundary_allocated": boundary,
        "peak_allocated": peak,
        "swapped_bytes": stats.bytes_to_host if stats else 0,
        "prefetched": stats.prefetched if stats else 0,
        "on_demand": stats.on_demand if stats else 0,
        "swap_copy_ms": copy_ms,  # d2h + h2d, over every step run, warm-up included
        "swap_compute_wait_ms": wait_ms,
        "swap_overlap_fraction": overlap,
        "swap_hook_ms": hook_ms,  # host time in the saved-tensor hooks, every step run
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--allocator", choices=("pytorch", "stowage"), default="pytorch")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps")
    ap.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--recompute-hidden", type=lambda v: [int(h) for h in v.split(",") if h], default=[],
                    help="more hidden sizes (comma-separated; ffn 4x) at which to measure the recompute's share")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--profile", default="", help="comma-separated configs whose second-to-last step is profiled "
                    "(torch.profiler; its table printed, the step left out of the times)")
    ap.add_argument("--profile-rows", type=int, default=25)
    args = ap.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    args.profile = [c for c in args.profile.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"unknown config {c!r}; choose from {', '.join(CONFIGS)}")
    if args.steps < 4 or args.accumulate < 1:
        ap.error("--steps must be at least 4 (two warm-up steps, one timed, one measured), --accumulate at least 1")
    device = torch.device(args.device)
    if args.allocator == "stowage":
        import stowage.torch as st
        st.enable(shim="required")
    torch.use_deterministic_algorithms(True)
    meter = Meter(device, args.allocator)
    results = {}
    for c in configs:
        results[c] = run("torch" if c == "torch_again" else c, device, meter, args)
        results[c]["config"] = c
        gc.collect()  # what the configuration left in reference cycles (torch's or the user's) is not the next one's
        if device.type == "cuda":
            torch.cuda.empty_cache() if args.allocator == "pytorch" else __import__("stowage.torch").torch.empty_cache()
    peer = results.get("torch")
    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"allocator {args.allocator}, {next(iter(results.values()))['parameters']:,} parameters, "
          f"batch {args.batch} x seq {args.seq}, {args.layers} layers")
    print(f"{'config':<23} {'same losses as':>15} {'step ms':>8} {'x torch':>8} {'boundary MiB':>13} "
          f"{'saved MiB':>10} {'peak MiB':>9} {'swapped MiB':>12}")
    for c, r in results.items():
        loss_peer = LOSS_PEER.get(c)
        same = "-" if loss_peer not in results else (
            f"{loss_peer}: {'yes' if r['losses'] == results[loss_peer]['losses'] else 'NO'}")
        r["same_losses_as_peer"] = None if loss_peer not in results else r["losses"] == results[loss_peer]["losses"]
        ratio = r["step_ms"] / peer["step_ms"] if peer and r["step_ms"] and peer["step_ms"] else None
        r["step_ratio_vs_torch"] = ratio
        saved = peer["boundary_allocated"] - r["boundary_allocated"] if peer else None
        r["boundary_saving_vs_torch"] = saved
        mib = 1 << 20
        print(f"{c:<23} {same:>15} {r['step_ms'] or 0:>8.2f} {ratio or 0:>8.3f} {r['boundary_allocated'] / mib:>13.1f} "
              f"{(saved or 0) / mib:>10.1f} {r['peak_allocated'] / mib:>9.1f} {r['swapped_bytes'] / mib:>12.1f}")
    for c, r in results.items():
        if r["swap_overlap_fraction"] is not None:
            print(f"{c}: swap copies took {r['swap_copy_ms']:.1f} ms over {args.steps} steps, compute waited "
                  f"{r['swap_compute_wait_ms']:.1f} ms for them: overlap fraction {r['swap_overlap_fraction']:.3f} "
                  f"({r['prefetched']} prefetched, {r['on_demand']} on demand); the hooks took {r['swap_hook_ms']:.1f} ms "
                  "of host time")
    link = None
    if device.type == "cuda" and any(c.startswith("offload_") for c in results):
        link = link_floor(results, link_gbps(device))
        share_text = f" = {100 * link['floor_share']:.1f} % of torch's step" if link["floor_share"] else ""
        print(f"link {link['h2d']:.1f} GB/s host to device, {link['d2h']:.1f} GB/s back: offloaded m and v cost at "
              f"least {link['floor_ms']:.2f} ms a step{share_text}")
    share = recompute_share(device, args) if "recompute" in results else None
    for kind, r in (share or {}).items():
        print(f"recompute of a {kind} MLP's activation: {r['recompute_ms']:.4f} ms against the MLP's forward + "
              f"backward {r['mlp_ms']:.4f} ms: {100 * r['share']:.2f} %")
    if args.json:
        with open(args.json, "w") as f:
            command = list(sys.argv[1:] if argv is None else argv)  # as given, for the write-up
            json.dump({"schema": "stowage.torch_techniques_bench/1", "args": vars(args), "command": command,
                       "results": results, "recompute_share": share, "link": link}, f, indent=1)
    bad = [c for c, r in results.items() if r["same_losses_as_peer"] is False]
    if bad:
        print(f"losses differ from the peer's in: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
