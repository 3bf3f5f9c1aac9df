#!/usr/bin/env python3
"""Writes the GPU section of bench/RESULTS.md from one run of `scripts/gpu-check.sh run`: its logs
folder (gpu-check.tgz unpacked). Every ratio is between two results of that run. The rest of the
file is kept; the section sits between the gpu-section markers that bench/report.py also keeps.

    python3 bench/gpu_results.py --logs DIR [DIR ...] [--out bench/RESULTS.md]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import GPU_BEGIN, GPU_END, Bench, num, ratio, real_ns, size_name, table, times  # noqa: E402


def text(logs: Path, name: str) -> str:
    p = logs / name
    return p.read_text(errors="replace") if p.exists() else ""


def machine(logs: Path) -> str:
    gpu = text(logs, "gpu.txt").splitlines()
    csv = next((line for line in gpu if "," in line and not line.startswith("name")), "")
    fields = [f.strip() for f in csv.split(",")]
    cores = next((line for line in gpu if line.strip().isdigit()), "?")
    name = fields[0] if fields and fields[0] else (gpu[0] if gpu else "unknown GPU")
    driver = f", driver {fields[1]}" if len(fields) > 1 else ""
    return f"{name}{driver}, {cores} CPU cores"


def tests(logs: Path) -> str:
    ctest = text(logs, "ctest.log")
    lines = []
    summary = re.findall(r"\d+% tests passed, \d+ tests? failed out of \d+", ctest)
    if summary:
        lines.append(f"- ctest (CUDA backend, every suite): {summary[-1]}.")
    failed = re.findall(r"^\s+\d+ - (.*) \((Failed|SEGFAULT|Timeout|Not Run|Exception|Subprocess aborted)\)$", ctest,
                        re.M)
    for name, why in failed:
        lines.append(f"  - failed: `{name}` ({why})")
    cuda = re.findall(r"Test +#\d+: (\S*cuda\S*) .*?(Passed|\*\*\*Skipped|\*\*\*Failed|\*\*\*Exception)", ctest, re.I)
    if cuda:
        counts = {k: sum(1 for _, r in cuda if k in r) for k in ("Passed", "Skipped", "Failed", "Exception")}
        lines.append(f"- of them CUDA instances: {counts['Passed']} passed, {counts['Failed'] + counts['Exception']} "
                     f"failed, {counts['Skipped']} skipped.")
    skipped = re.findall(r"^\s+\d+ - (\S*cuda\S*) .*\(Skipped\)$", ctest, re.M | re.I)
    for name in skipped:
        lines.append(f"  - skipped: `{name}`")
    sanitize = text(logs, "sanitize.log").splitlines()
    if sanitize:
        runs = {tool: sum(1 for line in sanitize if f" {tool} " in line + " ") for tool in ("memcheck", "racecheck",
                                                                                             "synccheck")}
        bad = [line for line in sanitize if not line.startswith("clean")]
        lines.append(f"- compute-sanitizer over the CUDA test instances (memcheck {runs['memcheck']}, racecheck "
                     f"{runs['racecheck']}, synccheck {runs['synccheck']} test programs): "
                     f"{len(sanitize) - len(bad)} clean, {len(bad)} not.")
        lines += [f"  - {line}" for line in bad]
    for log, what in (("pytest.log", "the Python package's tests (CPU and CUDA tensors)"),
                      ("pytest_gpu.log", "the drop-in's GPU tests (tests/test_torch_gpu.py)")):
        last = [line for line in text(logs, log).splitlines() if re.search(r"\d+ (passed|failed)", line)]
        if last:
            lines.append(f"- {what}: {last[-1].strip('= ')}.")
    return "\n".join(lines) if lines else "No test log in this run."


def allocator(logs: Path) -> str:
    b = Bench(logs / "allocator_bench.gpu.json")
    if not b.runs:
        return ""
    rows = []
    for size in (512, 64 << 10, 1 << 20, 8 << 20):
        t = {k: real_ns(b.find(rf"BM_CudaCachedPair_{k}/{size}/")) for k in
             ("Stowage", "StowageClassic", "CudaMallocAsync", "CudaMalloc")}
        rows.append([size_name(size), num(t["Stowage"]), num(t["StowageClassic"]), num(t["CudaMallocAsync"]),
                     num(t["CudaMalloc"]), times(ratio(t["CudaMallocAsync"], t["Stowage"])),
                     times(ratio(t["CudaMalloc"], t["Stowage"]))])
    rnd = {k: real_ns(b.find(rf"BM_CudaRandom_{k}/")) for k in ("Stowage", "StowageClassic", "CudaMallocAsync",
                                                                   "CudaMalloc")}
    out = ["### Allocator: cached alloc+free pair on GPU 0 (median host ns)", "",
           table(["size", "stowage", "stowage classic", "cudaMallocAsync", "cudaMalloc", "cudaMallocAsync / stowage",
                  "cudaMalloc / stowage"], rows), ""]
    if rnd["Stowage"]:
        out.append(f"Random-size program (4,096 operations): stowage {num(rnd['Stowage'] / 1e3)} µs; classic "
                   f"{times(ratio(rnd['StowageClassic'], rnd['Stowage']))}, cudaMallocAsync "
                   f"{times(ratio(rnd['CudaMallocAsync'], rnd['Stowage']))}, cudaMalloc "
                   f"{times(ratio(rnd['CudaMalloc'], rnd['Stowage']))} the time.")
    return "\n".join(out)


def precision(logs: Path) -> str:
    b = Bench(logs / "precision_bench.gpu.json")
    cp = b.find(r"BM_CudaCopyD2D")
    if cp is None:
        return ""
    copy_gbs = cp.get("bytes_per_second", 0) / 1e9
    rows = [["device-to-device copy (peer)", "—", num(real_ns(cp) / 1e6), num(copy_gbs), "1.00×"]]
    for bm, label in (("BM_CudaSplit", "split"), ("BM_CudaMerge", "merge"), ("BM_CudaAdamWFused", "fused AdamW")):
        for arg in (0, 1):
            x = b.find(rf"{bm}/{arg}")
            gbs = None if x is None else x.get("bytes_per_second", 0) / 1e9
            rows.append([label, x.get("label", str(arg)) if x else str(arg),
                         num(None if x is None else real_ns(x) / 1e6), num(gbs), times(ratio(gbs, copy_gbs))])
    return "\n".join(["### Split storage and fused AdamW vs a D2D copy (64 Mi elements, random data, CUDA events)", "",
                      "GB/s counts the bytes each kernel must read and write once.", "",
                      table(["kernel", "rounding", "ms", "GB/s", "vs D2D copy"], rows, "llrrr")])


def offload(logs: Path) -> str:
    b = Bench(logs / "offload_bench.gpu.json")
    out = []
    rows = []
    for size in (64 << 10, 256 << 10, 1 << 20, 4 << 20):
        pool = real_ns(b.find(rf"BM_CudaHostPool/{size}"))
        each = real_ns(b.find(rf"BM_CudaHostAllocPerBuffer/{size}"))
        if pool or each:
            rows.append([size_name(size), num(pool), num(each), times(ratio(each, pool))])
    if rows:
        out += ["### Pinned host memory: allocate+free (median ns)", "",
                table(["size", "stowage pinned pool", "cudaHostAlloc + cudaFreeHost", "ratio"], rows), ""]
    swap = text(logs, "offload_tool.gpu.md").strip()
    if swap:
        out += ["### Swap over the real link (`offload_tool --cuda 1`)", "", swap, ""]
    return "\n".join(out).rstrip()


def torch_allocator(logs: Path) -> str:
    bench = text(logs, "torch_allocator_bench.txt").strip()
    pluggable = text(logs, "torch.log").strip()
    out = []
    if bench:
        out += ["### PyTorch drop-in: allocation pair and peak reserved (`bench/torch_allocator_bench.py`)", "", bench, ""]
    if pluggable:
        out += ["### PyTorch drop-in: a transformer trained (`tests/integration/torch_pluggable.py`)", "", pluggable, ""]
    paths = text(logs, "torch_recompute_paths.txt").strip()
    if paths:
        out += ["### Recompute in a whole layer, in place against the general path (`bench/torch_recompute_paths.py`)",
                "", paths, ""]
    return "\n".join(out).rstrip()


def techniques(logs: Path) -> str:
    out = []
    for run in ("pytorch", "stowage", "offload", "offload_large", "offload_large_8", "swap_large"):
        p = logs / f"torch_techniques.{run}.json"
        if not p.exists():
            said = text(logs, f"torch_techniques.{run}.txt").strip().splitlines()
            if said:
                out += [f"### PyTorch techniques ({run} run): did not finish", "", f"`{said[-1].strip()}`", ""]
            continue
        data = json.loads(p.read_text())
        args, results = data["args"], data["results"]
        first = next(iter(results.values()))
        rows = []
        for c, r in results.items():
            peer = r.get("same_losses_as_peer")
            same = "—" if peer is None else ("yes" if peer else "**no**")
            rows.append([c, same, num(r["step_ms"]), times(r.get("step_ratio_vs_torch")),
                         num(r["boundary_allocated"] / 2 ** 20), num((r.get("boundary_saving_vs_torch") or 0) / 2 ** 20),
                         num(r["peak_allocated"] / 2 ** 20), num(r["swapped_bytes"] / 2 ** 20 / max(1, args["steps"]))])
        allocator, accumulate = args["allocator"], args.get("accumulate", 1)
        command = f"--allocator {allocator}" + (f" --accumulate {accumulate} --configs {args['configs']}"
                                                  if run.startswith("offload") or run == "swap_large" else "")
        if run.startswith("offload_large") or run == "swap_large":
            command += f" --batch {args['batch']} --steps {args['steps']}"
        if "command" in data:  # the arguments as given, from 2026-11-27's second session on
            command = " ".join(a for a in data["command"] if not a.endswith(".json") and a != "--json")
        out += [f"### PyTorch techniques on the small GPT, {allocator} allocator, {accumulate} micro-batch(es) a step "
                f"(`bench/torch_techniques_bench.py {command}`)", "",
                f"{first['parameters']:,} parameters, batch {args['batch']} × sequence {args['seq']}, {args['layers']} "
                f"layers, hidden {args['hidden']}, ffn {args['ffn']}; {args['steps']} optimizer steps of "
                f"{args.get('accumulate', 1)} micro-batch(es), median step time after two warm-up steps. "
                "'boundary' is the device bytes allocated at the last step's forward/backward boundary; 'saved' is "
                "torch's boundary less this one. Losses are compared with the configuration's peer (see the script).",
                "", table(["config", "same losses", "step ms", "vs torch", "boundary MiB", "saved MiB", "peak MiB",
                           "swapped MiB/step"], rows), ""]
        swaps = [(c, r) for c, r in results.items() if r.get("swap_overlap_fraction") is not None]
        if swaps:
            out += ["Swap, over every step run: " + "; ".join(
                f"{c}: copies {num(r['swap_copy_ms'])} ms, compute waited {num(r['swap_compute_wait_ms'])} ms "
                f"(overlap {r['swap_overlap_fraction']:.3f})"
                + (f", hooks {num(r['swap_hook_ms'])} ms of host time" if "swap_hook_ms" in r else "")
                for c, r in swaps) + ".", ""]
        link = data.get("link")
        if link:
            of_step = f" = {100 * link['floor_share']:.1f} % of torch's step" if link.get("floor_share") else ""
            out += [f"Link (pinned, 256 MiB copies): {num(link['h2d'])} GB/s host to device, {num(link['d2h'])} GB/s "
                    f"back. Offloaded m and v are read and written once a step, 8 B a parameter each way: at least "
                    f"{num(link['floor_ms'])} ms a step{of_step}.", ""]
        share = data.get("recompute_share")
        if share:
            out += ["Recompute against its MLP, per layer, in isolation with the model's shapes (bf16): the MLP's "
                    "forward + backward, and one recompute: the activation's forward and the copy into the released "
                    "storage, or (path `into`, from 2026-11-27's second session on) the activation computed "
                    "straight into it.", "",
                    table(["MLP", "forward + backward ms", "recompute ms", "recompute / MLP", "path"],
                          [[k, num(r["mlp_ms"]), num(r["recompute_ms"]), f"{100 * r['share']:.2f} %",
                            r.get("path", "forward + copy")] for k, r in share.items()]), ""]
    return "\n".join(out).rstrip()


def run_meta(logs: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text(logs, "run.meta").splitlines() if "=" in line)


INTRO = ("## GPU\n\nWritten by `bench/gpu_results.py` from the logs of `scripts/gpu-check.sh run` (its tests, "
         "torch, sanitize and bench phases); every ratio is between two results of the same run.")


def section(runs: list[Path], earlier: str = "") -> str:
    """One block per run (newest last), after the earlier runs' blocks; each ratio within a block is between
    results of that run."""
    parts = [INTRO] + ([earlier.strip()] if earlier.strip() else [])
    for logs in runs:
        meta = run_meta(logs)
        blocks = [f"### Run of {meta.get('date', 'unknown date')}, commit `{meta.get('commit', 'unknown')}`\n\n"
                  f"Machine: {machine(logs)}.", "#### Tests\n\n" + tests(logs), allocator(logs),
                  torch_allocator(logs), techniques(logs), precision(logs), offload(logs)]
        # The run's sub-sections sit one level below its heading.
        parts.append("\n\n".join([blocks[0]] + [b.replace("### ", "#### ") if b.startswith("### ") else b
                                                 for b in blocks[1:] if b]))
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", type=Path, nargs="+", required=True,
                    help="unpacked gpu-check.tgz folders, one per run, oldest first")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "RESULTS.md")
    ap.add_argument("--append", action="store_true",
                    help="keep the runs already in the GPU section and add these after them")
    args = ap.parse_args(argv)
    for logs in args.logs:
        if not (logs / "gpu.txt").exists():
            ap.error(f"{logs} holds no gpu.txt: not a gpu-check logs folder")
    old = args.out.read_text() if args.out.exists() else ""
    i, j = old.find(GPU_BEGIN), old.find(GPU_END)
    earlier = ""
    if args.append and 0 <= i < j:
        current = old[i + len(GPU_BEGIN):j]
        k = current.find("### Run of ")
        earlier = current[k:] if k >= 0 else ""
    body = section(args.logs, earlier)
    new_section = f"{GPU_BEGIN}\n{body}{GPU_END}"
    new = old[:i] + new_section + old[j + len(GPU_END):] if 0 <= i < j else old.rstrip() + "\n\n" + new_section + "\n"
    args.out.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
