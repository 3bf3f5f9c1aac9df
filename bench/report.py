#!/usr/bin/env python3
"""Writes bench/RESULTS.md from the raw results bench/run_all.sh leaves in one directory:
NAME.json (Google Benchmark, --benchmark_out_format=json), NAME.md (a tool's standard output,
markdown), NAME.meta (command, seconds, exit status, load average) and run.meta (machine, date,
commit). Every ratio is computed from two results of the same run. The GPU section of an
existing report is kept unless this run measured the GPU itself.

    python3 bench/report.py --raw DIR --out bench/RESULTS.md
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

GPU_BEGIN = "<!-- gpu-section:begin -->"
GPU_END = "<!-- gpu-section:end -->"

NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


# ---------------------------------------------------------------- inputs


def read_meta(path: Path) -> dict[str, str]:
    meta: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                meta[k] = v
    return meta


class Bench:
    """One Google Benchmark JSON file: results by run name (the median when repeated)."""

    def __init__(self, path: Path):
        self.ok = path.exists()
        self.runs: dict[str, dict] = {}
        if not self.ok:
            return
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            self.ok = False
            return
        for b in data.get("benchmarks", []):
            name = b.get("run_name", b["name"])
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_name") == "median":
                    self.runs[name] = b
            elif name not in self.runs:
                self.runs[name] = b

    def find(self, pattern: str) -> dict | None:
        """The run whose name matches the regular expression (anchored at the start)."""
        rx = re.compile(pattern)
        for name, b in self.runs.items():
            if rx.match(name) and not b.get("error_occurred"):
                return b
        return None

    def error(self, pattern: str) -> str | None:
        rx = re.compile(pattern)
        for name, b in self.runs.items():
            if rx.match(name) and b.get("error_occurred"):
                return b.get("error_message", "error")
        return None


def cpu_ns(b: dict | None) -> float | None:
    return None if b is None else b["cpu_time"] * NS[b.get("time_unit", "ns")]


def real_ns(b: dict | None) -> float | None:
    return None if b is None else b["real_time"] * NS[b.get("time_unit", "ns")]


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


# ---------------------------------------------------------------- formatting


def num(x: float | None, digits: int = 3) -> str:
    """A number with `digits` significant digits (whole numbers from 10^digits up); '—' when missing."""
    if x is None:
        return "—"
    ax = abs(x)
    if ax >= 10 ** digits:
        return f"{x:,.0f}"
    if ax == 0:
        return "0"
    dec = max(0, digits - 1 - math.floor(math.log10(ax)))
    return f"{x:.{dec}f}"


def times(x: float | None) -> str:
    return "—" if x is None else f"{num(x)}×"


def pct(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{100 * x:.{digits}f} %"


def size_name(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(sep) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


class Report:
    def __init__(self, raw: Path, run: dict[str, str]):
        self.raw = raw
        self.run = run
        self.parts: list[str] = []
        self.headline: dict[str, str] = {}

    def add(self, text: str) -> None:
        self.parts.append(text.rstrip() + "\n")

    def bench(self, name: str) -> Bench:
        return Bench(self.raw / f"{name}.json")

    def command(self, name: str) -> str:
        m = read_meta(self.raw / f"{name}.meta")
        if not m:
            return ""
        line = f"Command: `{m.get('command', name)}` — {m.get('seconds', '?')} s, load average " \
               f"{m.get('load_before', '?')} → {m.get('load_after', '?')}"
        if m.get("rc", "0") != "0":
            line += f", **exit status {m['rc']}**"
        return line + "."

    def missing(self, name: str) -> str:
        m = read_meta(self.raw / f"{name}.meta")
        if not m:
            return f"_`{name}` was not built or not run in this run._"
        err = (self.raw / f"{name}.stderr")
        tail = err.read_text().strip().splitlines()[-3:] if err.exists() else []
        return f"_`{name}` produced no results (exit status {m.get('rc', '?')})" + \
            (": `" + " / ".join(tail) + "`" if tail else "") + "._"


# ---------------------------------------------------------------- areas


def allocator(r: Report) -> None:
    r.add("## Allocator: caching allocator vs glibc malloc and jemalloc\n\n"
          "Discussion: [results/allocator.md](results/allocator.md). Emulated device; device memory is never "
          "touched, so these measure the allocators' bookkeeping. Peers in the same executable: glibc "
          "`__libc_malloc`/`__libc_free` and jemalloc `mallocx`/`dallocx`.")
    b = r.bench("allocator_bench")
    r.add(r.command("allocator_bench"))
    if not b.ok:
        r.add(r.missing("allocator_bench"))
    else:
        rows = []
        for n in (512, 64 << 10, 1 << 20, 8 << 20):
            e, c, g, j = (b.find(f"BM_CachedPair_{k}/{n}$") for k in ("Stowage", "StowageClassic", "Glibc", "Jemalloc"))
            rows.append([size_name(n), num(cpu_ns(e)), num(cpu_ns(c)), num(cpu_ns(g)), num(cpu_ns(j)),
                         num(real_ns(e)), times(ratio(cpu_ns(e), cpu_ns(g))), times(ratio(cpu_ns(e), cpu_ns(j)))])
            if n == 1 << 20:
                r.headline["alloc_1m_vs_glibc"] = times(ratio(cpu_ns(e), cpu_ns(g)))
                r.headline["alloc_1m_vs_jemalloc"] = times(ratio(cpu_ns(e), cpu_ns(j)))
                r.headline["alloc_1m_ns"] = num(cpu_ns(e))
                r.headline["alloc_1m_jemalloc_ns"] = num(cpu_ns(j))
                r.headline["alloc_1m_glibc_ns"] = num(cpu_ns(g))
            if n == 512:
                r.headline["alloc_512_vs_glibc"] = times(ratio(cpu_ns(e), cpu_ns(g)))
        r.add("### Cached alloc+free pair (median, CPU time)\n\n"
              "One `allocate(n)` + `deallocate` of a size already cached. Time ratios are stowage (expandable) "
              "time / peer time: below 1, stowage is faster.\n\n" +
              table(["size", "stowage expandable ns", "stowage classic ns", "glibc ns", "jemalloc ns",
                     "stowage wall ns", "stowage / glibc", "stowage / jemalloc"], rows))
        base = b.find("BM_Random_Stowage$")
        rows = []
        for label, key in (("stowage expandable", "Stowage"), ("stowage classic", "StowageClassic"),
                           ("glibc malloc", "Glibc"), ("jemalloc mallocx", "Jemalloc")):
            x = b.find(f"BM_Random_{key}$")
            res = x.get("reserved_MiB") if x else None
            rows.append([label, num(None if x is None else cpu_ns(x) / 1e3),
                         "—" if x is None else f"{x.get('items_per_second', 0) / 1e6:.2f} M",
                         times(ratio(cpu_ns(x), cpu_ns(base))), "—" if res is None else f"{res:.0f} MiB"])
            if key == "Glibc":
                r.headline["random_glibc_vs_stowage"] = times(ratio(cpu_ns(x), cpu_ns(base)))
            if key == "Jemalloc":
                r.headline["random_jemalloc_vs_stowage"] = times(ratio(cpu_ns(x), cpu_ns(base)))
        r.add("### Random sizes (median, CPU time)\n\n"
              "A fixed program of 4,096 allocations/frees (at most 64 live), sizes log-uniform in 256 B .. 64 MiB, "
              "freed in random order; the same program for every allocator. Ratio: time / stowage expandable's.\n\n" +
              table(["allocator", "µs per program", "ops/s", "time vs stowage expandable", "peak reserved"], rows))
    tool_section(r, "fragmentation_tool", "Fragmentation on a transformer training step",
                 "Peak reserved / peak allocated with classic segments (the peer) and expandable segments, "
                 "replaying a generated 24-layer training-step trace.")
    allocator_threads(r)


def allocator_threads(r: Report) -> None:
    """allocator_threads_bench: cached pairs from 1, 2 and 8 threads on one device (total throughput,
    Google Benchmark's items_per_second over all threads), against glibc and jemalloc in the same run."""
    b = r.bench("allocator_threads_bench")
    if not b.ok or not b.runs:
        if (r.raw / "allocator_threads_bench.meta").exists():
            r.add(r.missing("allocator_threads_bench"))
        return
    kinds = (("C ABI", "CApi"), ("C++ API", "Direct"), ("C++ API, no threads' caches", "NoCache"),
             ("glibc", "Glibc"), ("jemalloc", "Jemalloc"))
    rows = []
    for n in (64 << 10, 1 << 20):
        for label, key in kinds:
            rate = {t: (b.find(rf"BM_ThreadsPair_{key}/{n}/real_time/threads:{t}$") or {}).get("items_per_second")
                    for t in (1, 2, 8)}
            one = b.find(rf"BM_ThreadsPair_{key}/{n}/real_time/threads:1$")
            glibc = b.find(rf"BM_ThreadsPair_Glibc/{n}/real_time/threads:1$")
            rows.append([size_name(n), label, num(real_ns(one)), times(ratio(real_ns(one), real_ns(glibc))),
                         num(None if rate[1] is None else rate[1] / 1e6), times(ratio(rate[2], rate[1])),
                         times(ratio(rate[8], rate[2]))])
            if n == 64 << 10 and key == "CApi":
                r.headline["threads_capi_vs_glibc"] = times(ratio(real_ns(one), real_ns(glibc)))
                r.headline["threads_two_vs_one"] = times(ratio(rate[2], rate[1]))
    r.add("### Threads on one device: cached pairs (`allocator_threads_bench`, medians)\n\n"
          f"{r.command('allocator_threads_bench')}\n\nOne thread's pair in wall ns and against glibc's; total "
          "throughput of two threads over one, and of eight over two (the issue's targets: one thread "
          "≤ 2× glibc, two threads ≥ 1.5× one, eight no worse than two).\n\n" +
          table(["size", "path", "1 thread ns/pair", "vs glibc", "1 thread M pairs/s", "2 threads / 1",
                 "8 threads / 2"], rows, "llrrrrr"))


def storage(r: Report) -> None:
    r.add("## Storage and C ABI: `stowage_malloc` overhead, event-log replay vs glibc malloc\n\n"
          "Discussion: [results/storage_capi.md](results/storage_capi.md).")
    b = r.bench("capi_bench")
    r.add(r.command("capi_bench"))
    if not b.ok:
        r.add(r.missing("capi_bench"))
    else:
        rows = []
        for n in (4096, 1 << 20, 64 << 20):
            c, d, h = (b.find(f"BM_{k}/{n}$") for k in ("CApiPair", "DirectPair", "HostMallocPair"))
            rows.append([size_name(n), num(cpu_ns(c)), num(cpu_ns(d)), times(ratio(cpu_ns(c), cpu_ns(d))),
                         num(cpu_ns(h)), times(ratio(cpu_ns(c), cpu_ns(h)))])
            if n == 4096:
                r.headline["capi_overhead"] = times(ratio(cpu_ns(c), cpu_ns(d)))
        r.add("### C ABI: cached alloc+free pair (median, CPU time)\n\n"
              "`stowage_malloc` + `stowage_free` against `CachingAllocator::allocate`/`deallocate` called directly, "
              "and host `malloc`/`free` (jemalloc, linked into the executable) of the same size.\n\n" +
              table(["size", "C ABI ns", "direct ns", "C ABI / direct", "host malloc ns", "C ABI / host malloc"], rows))
    for part, title in (("replay_tool.large", "Event-log replay: one training step (24 layers, hidden 2048)"),
                        ("replay_tool.small", "Event-log replay: a smaller step (12 layers, hidden 1024)")):
        text = tool_output(r, part)
        if text is None:
            continue
        ratios = replay_ratios(text)
        extra = ""
        if ratios:
            extra = "\n\nTime per operation vs glibc malloc (same run): " + \
                    ", ".join(f"{k} {times(v)}" for k, v in ratios.items()) + "."
            if part.endswith("large"):
                r.headline["replay_classic_vs_glibc"] = times(ratios.get("stowage classic"))
        r.add(f"### {title}\n\n{r.command(part)}\n\n{text.strip()}{extra}")


def replay_ratios(text: str) -> dict[str, float]:
    """ns/op of each allocator in replay_tool's table, over glibc malloc's."""
    ns: dict[str, float] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"[0-9.]+", cells[2] or "x"):
            name = cells[0]
            m = re.match(r"stowage CachingAllocator \((\w+)\)", name)
            ns[f"stowage {m.group(1)}" if m else name] = float(cells[2])
    g = ns.pop("glibc malloc", None)
    return {k: v / g for k, v in ns.items()} if g else {}


def device(r: Report) -> None:
    r.add("## Device: emulated copy engine vs memcpy\n\n"
          "Discussion: [results/device.md](results/device.md). 64 MiB per copy from/to a pinned host buffer, "
          "one stream, wall time; the peer is `memcpy` of the same bytes on the calling thread. "
          "GB/s = 10^9 bytes/s.")
    b = r.bench("device_bench")
    r.add(r.command("device_bench"))
    if not b.ok:
        r.add(r.missing("device_bench"))
        return
    mc = b.find(r"BM_Memcpy")
    mgb = None if mc is None else mc.get("bytes_per_second", 0) / 1e9
    rows = [["memcpy (peer)", "—", num(mgb), "1.00", "—"]]
    for link in (0, 2, 8, 32):
        for d2h in (0, 1):
            x = b.find(rf"BM_EmulatedCopy/d2h:{d2h}/link_gbps:{link}/")
            gb = None if x is None else x.get("bytes_per_second", 0) / 1e9
            rows.append(["D2H" if d2h else "H2D", f"{link} GB/s" if link else "unthrottled", num(gb),
                         num(ratio(gb, mgb)), num(ratio(gb, float(link))) if link else "—"])
            if link == 0 and d2h == 0:
                r.headline["h2d_vs_memcpy"] = num(ratio(gb, mgb))
            if link == 2 and d2h == 0:
                r.headline["h2d_2gbps"] = num(gb)
    r.add("### Copy bandwidth (median)\n\n" +
          table(["copy", "link setting", "GB/s", "vs memcpy", "vs link setting"], rows, "llrrr"))
    ms = {}
    labels = ["copy only", "kernel only", "both on one stream (serial)", "both on two streams"]
    for mode in range(4):
        x = b.find(rf"BM_CopyComputeOverlap/mode:{mode}/")
        ms[mode] = None if x is None else real_ns(x) / 1e6
    rows = [[labels[m], num(ms[m])] for m in range(4)]
    hidden = None
    if None not in ms.values():
        hidden = (ms[2] - ms[3]) / min(ms[0], ms[1]) if min(ms[0], ms[1]) > 0 else None
    r.add("### Copy/compute overlap (median, wall ms)\n\n"
          "A 16 MiB H2D copy at 2 GB/s and a host kernel; on two streams the shorter of the two should hide behind "
          "the longer. Hidden = (serial − two streams) / the shorter one" +
          (f": **{pct(hidden, 0)}** in this run." if hidden is not None else ".") +
          (" Below a few per cent there is no measurable overlap: the copy engine's thread and the kernel "
           "compete for the same cores and memory bus, which other processes share too (the write-up has a "
           "run where two streams hid 60 % of the kernel)." if hidden is not None and hidden < 0.05 else "") +
          "\n\n" +
          table(["mode", "ms"], rows))


def precision(r: Report) -> None:
    r.add("## Precision: split storage vs memcpy, fused AdamW vs unfused\n\n"
          "Discussion: [results/precision.md](results/precision.md). Single thread, 16 Mi elements (64 MiB per "
          "fp32 array), CPU time. Bytes/s counts every byte read and written (memcpy 8 B/element, split and merge "
          "8 B/element, AdamW 28 B/element with fp32 grads, 26 B with bf16).")
    b = r.bench("precision_bench")
    r.add(r.command("precision_bench"))
    if not b.ok:
        r.add(r.missing("precision_bench"))
        return
    mc = b.find(r"BM_Memcpy")
    mgb = None if mc is None else mc.get("bytes_per_second", 0) / 1e9
    rows = []
    best: dict[str, float] = {}
    for kind, bm in (("split", "BM_Split"), ("merge", "BM_Merge")):
        for level in (2, 1, 0):
            for rnd in (0, 1):
                x = b.find(rf"{bm}/{level}/{rnd}$")
                if x is None:
                    continue
                label = x.get("label", "").split()
                simd = label[0] if label else str(level)
                rounding = label[1] if len(label) > 1 else str(rnd)
                gb = x.get("bytes_per_second", 0) / 1e9
                rows.append([kind, simd, rounding, num(gb), times(ratio(gb, mgb))])
                if rounding == "half_up" and kind not in best:
                    best[kind] = gb
                    r.headline["split_simd"] = simd
    r.add(f"### Split / merge vs memcpy of the same bytes (median, memcpy {num(mgb)} GB/s in this run)\n\n"
          "Rows for SIMD levels the CPU lacks are left out.\n\n" +
          table(["kernel", "SIMD", "rounding", "GB/s", "vs memcpy"], rows, "lllrr"))
    r.headline["split_vs_memcpy"] = times(ratio(best.get("split"), mgb))
    r.headline["merge_vs_memcpy"] = times(ratio(best.get("merge"), mgb))
    rows = []
    for rnd, rname in ((0, "half_up"), (1, "nearest_even")):
        for g, gname in ((0, "f32"), (1, "bf16")):
            f = b.find(rf"BM_AdamWFused/{rnd}/{g}$")
            u = b.find(rf"BM_AdamWUnfused/{rnd}/{g}$")
            fgb = None if f is None else f.get("bytes_per_second", 0) / 1e9
            t = b.find(rf"BM_AdamWTraffic/{g}$")
            speed = ratio(cpu_ns(u), cpu_ns(f))
            floor = ratio(cpu_ns(t), cpu_ns(f))
            rows.append([rname, gname, num(None if f is None else cpu_ns(f) / 1e6),
                         num(None if u is None else cpu_ns(u) / 1e6), times(speed),
                         num(None if t is None else cpu_ns(t) / 1e6), times(floor), num(fgb), times(ratio(fgb, mgb))])
            if rnd == 0 and g == 0:
                r.headline["adamw_speedup"] = times(speed)
                r.headline["adamw_vs_floor"] = times(floor)
            if rnd == 1 and g == 0:
                r.headline["adamw_speedup_rne"] = times(speed)
    r.add("### Fused AdamW on split storage vs unfused (merge → fp32 AdamW → split), best SIMD level\n\n"
          "The traffic floor is `BM_AdamWTraffic`: the fused step's own streams (read hi, lo, grad, m, v; write "
          "hi, lo, m, v) with one cheap operation per element, measured in the same run; \"vs floor\" is floor "
          "time / fused time, the fused step's rate as a fraction of the floor's (1.00× means it runs at its "
          "memory bound; the target, within 20 % of the floor, is 0.80× or more).\n\n" +
          table(["rounding", "grads", "fused ms", "unfused ms", "fused speed-up", "floor ms", "fused vs floor",
                 "fused GB/s", "fused rate vs memcpy"], rows, "llrrrrrrr"))


def recompute(r: Report) -> None:
    r.add("## Recompute: SwiGLU recompute vs the MLP matmuls, memory saved\n\n"
          "Discussion: [results/recompute.md](results/recompute.md). Llama-2-7B MLP (hidden 4096, intermediate "
          "11008), single thread, CPU time; the peer is the bench's own blocked fp32 matmul in the same run.")
    b = r.bench("recompute_bench")
    r.add(r.command("recompute_bench"))
    if not b.ok:
        r.add(r.missing("recompute_bench"))
        return
    f = b.find(r"BM_MlpRecomputeFraction")
    tokens = int(f["tokens"]) if f and "tokens" in f else 256
    rows = []
    gu, dn = b.find(r"BM_MatmulGateUp"), b.find(r"BM_MatmulDown")
    rows.append([f"gate_up matmul [{tokens}×4096]·[4096×22016]", num(None if gu is None else cpu_ns(gu) / 1e6),
                 "—" if gu is None else f"{gu.get('GFLOP/s', 0):.1f} GFLOP/s"])
    rows.append([f"down matmul [{tokens}×11008]·[11008×4096]", num(None if dn is None else cpu_ns(dn) / 1e6),
                 "—" if dn is None else f"{dn.get('GFLOP/s', 0):.1f} GFLOP/s"])
    for arg, dt in ((0, "fp32"), (1, "bf16")):
        x = b.find(rf"BM_SwiGLUForward/{arg}")
        rows.append([f"SwiGLU forward (the recompute), {dt}", num(None if x is None else cpu_ns(x) / 1e6),
                     "—" if x is None else f"{x.get('items_per_second', 0) / 1e6:.0f} M elem/s"])
    for arg in range(4):
        x = b.find(rf"BM_ActivationForward/{arg}")
        if x is not None:
            rows.append([f"{x.get('label', arg)} forward, fp32", num(cpu_ns(x) / 1e6),
                         f"{x.get('items_per_second', 0) / 1e6:.0f} M elem/s"])
    r.add("### Kernel times (CPU ms)\n\n" + table(["step", "CPU ms", "rate"], rows, "lrr"))
    if f is not None:
        rows = [["fp32 SwiGLU recompute / forward MLP matmuls", f"**{pct(f.get('f32_vs_fwd_matmuls'))}**",
                 f"{num(f.get('swiglu_f32_ms'))} ms / {num(f.get('matmuls_ms'))} ms"],
                ["fp32 SwiGLU recompute / step MLP matmuls (forward + 2× in backward)",
                 f"**{pct(f.get('f32_vs_step_matmuls'), 3)}**", ""],
                ["bf16 SwiGLU recompute / forward MLP matmuls", pct(f.get("bf16_vs_fwd_matmuls")),
                 f"{num(f.get('swiglu_bf16_ms'))} ms / {num(f.get('matmuls_ms'))} ms"]]
        r.headline["recompute_step_fraction"] = pct(f.get("f32_vs_step_matmuls"), 3)
        r.add(f"### Recompute cost against the matmuls, back to back in one iteration ({tokens} tokens)\n\n" +
              table(["ratio", "value", "times"], rows, "lrr"))
    m = b.find(r"BM_MemorySaved")
    if m is not None:
        keep, rel, saved = m.get("peak_MiB_keep"), m.get("peak_MiB_release"), m.get("saved_MiB")
        per = m.get("act_MiB_per_layer")
        r.headline["recompute_saved"] = f"{num(saved, 4)} MiB of {num(keep, 4)} MiB ({pct(ratio(saved, keep), 0)})"
        r.add("### Device memory saved (32 layers, bf16, emulated device; peak `allocated_bytes`)\n\n"
              "The peer is the same forward/backward with the SwiGLU outputs kept.\n\n" +
              table(["tokens", "SwiGLU output per layer", "peak, keep", "peak, release", "saved", "release / keep"],
                    [[str(tokens), f"{num(per, 4)} MiB", f"{num(keep, 4)} MiB", f"{num(rel, 4)} MiB",
                      f"**{num(saved, 4)} MiB**", num(ratio(rel, keep))]]))


def offload(r: Report) -> None:
    r.add("## Offload: pinned host pool, swap-attention, optimizer offload\n\n"
          "Discussion: [results/offload.md](results/offload.md).")
    b = r.bench("offload_bench")
    r.add(r.command("offload_bench"))
    if not b.ok:
        r.add(r.missing("offload_bench"))
    else:
        rows = []
        for n in (64 << 10, 256 << 10, 1 << 20, 4 << 20):
            j, bi, ml, ph = (b.find(f"BM_{k}/{n}$") for k in
                             ("HostPoolJemalloc", "HostPoolBuiltin", "MmapMlockPerBuffer", "MmapPinHostPerBuffer"))
            ml_cell = num(cpu_ns(ml)) if ml else "refused" if b.error(f"BM_MmapMlockPerBuffer/{n}$") else "—"
            rows.append([size_name(n), num(cpu_ns(j)), num(cpu_ns(bi)), ml_cell, num(cpu_ns(ph)),
                         times(ratio(cpu_ns(ml), cpu_ns(j))), times(ratio(cpu_ns(ml), cpu_ns(bi))),
                         times(ratio(cpu_ns(ph), cpu_ns(bi)))])
            if n == 1 << 20:
                r.headline["pool_vs_mlock"] = times(ratio(cpu_ns(ml), cpu_ns(bi)))
        r.add("### Pinned host memory: allocate+free pair (CPU ns)\n\n"
              "The host pool (pages mapped and pinned once) against pinning per buffer: mmap + mlock + munlock + "
              "munmap, and mmap(MAP_POPULATE) + the emulated device's `pin_host`/`unpin_host` + munmap. Ratios are "
              "per-buffer time / pool time: how many times slower pinning per buffer is.\n\n" +
              table(["size", "pool, jemalloc", "pool, builtin", "mmap+mlock", "mmap+pin_host",
                     "mlock / pool (jemalloc)", "mlock / pool (builtin)", "pin_host / pool (builtin)"], rows))
    text = tool_output(r, "offload_tool")
    if text is not None:
        rows = swap_rows(text)
        note = ""
        if rows:
            first = rows[0]
            r.headline["swap_hidden"] = first["hidden"]
            r.headline["swap_ratio"] = first["ratio"]
            r.headline["swap_drop"] = first["drop"]
            r.headline["swap_swapped"] = first["swapped"]
            note = "\n\nStep time with swap / without (same run): " + ", ".join(
                f"compute/transfer {x['ratio']} distance {x['distance']}: {times(x['slowdown'])}" for x in rows) + "."
        r.add("### Swap-attention: overlap and device peak (emulated device, throttled link)\n\n"
              "The peer is the same schedule without swap, measured in the same run. \"hidden\" = 1 − (step time "
              "with swap − without) / copy time on the copy streams.\n\n" + r.command("offload_tool") + "\n\n" +
              text.strip() + note)


def swap_rows(text: str) -> list[dict]:
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 12 and re.fullmatch(r"[0-9.]+", cells[0]):
            try:
                rows.append({"ratio": cells[0], "distance": cells[1], "hidden": cells[5], "swapped": cells[8],
                             "drop": cells[11], "slowdown": float(cells[3]) / float(cells[2])})
            except (ValueError, ZeroDivisionError):
                pass
    return rows


def tool_output(r: Report, name: str) -> str | None:
    path = r.raw / f"{name}.md"
    if not path.exists():
        return None
    text = path.read_text()
    if not text.strip():
        r.add(r.missing(name))
        return None
    return text


def tool_section(r: Report, name: str, title: str, intro: str = "") -> None:
    """A tool's markdown verbatim: under its own `### ` heading when it prints one, else under `title`."""
    text = tool_output(r, name)
    if text is None:
        if not (r.raw / f"{name}.meta").exists():
            return
        return
    cmd = r.command(name)
    stripped = text.strip()
    if stripped.startswith("### "):
        heading, _, body = stripped.partition("\n")
        r.add(f"{heading}\n\n{cmd}\n{body}")
    else:
        r.add(f"### {title}\n\n" + (intro + "\n\n" if intro else "") + f"{cmd}\n\n{stripped}")


AREAS = [("allocator", allocator, ("fragmentation", "allocator")), ("storage", storage, ("replay", "capi", "storage")),
         ("device", device, ("device",)), ("precision", precision, ("precision",)),
         ("recompute", recompute, ("recompute",)), ("offload", offload, ("offload",))]
HANDLED_TOOLS = {"fragmentation_tool", "replay_tool", "offload_tool"}


# ---------------------------------------------------------------- GPU


def gpu_section(r: Report, old: str | None) -> str:
    b = Bench(r.raw / "precision_bench.gpu.json")
    if b.ok and b.runs:
        cp = b.find(r"BM_CudaCopyD2D")
        cgb = None if cp is None else cp.get("bytes_per_second", 0) / 1e9
        rows = [["device-to-device copy (peer)", "—", num(None if cp is None else real_ns(cp) / 1e6), num(cgb), "1.00"]]
        for bm, label in (("BM_CudaSplit", "split"), ("BM_CudaMerge", "merge"), ("BM_CudaAdamWFused", "fused AdamW")):
            for arg in (0, 1):
                x = b.find(rf"{bm}/{arg}")
                gb = None if x is None else x.get("bytes_per_second", 0) / 1e9
                rows.append([label, x.get("label", str(arg)) if x else str(arg),
                             num(None if x is None else real_ns(x) / 1e6), num(gb), times(ratio(gb, cgb))])
        run = r.run
        body = (f"## GPU\n\nMachine: {run.get('gpu')} ({run.get('date')}, commit {run.get('commit')}, "
                f"`{run.get('command')}`). Timed with CUDA events; 64 Mi elements (256 MiB per fp32 array).\n\n"
                f"{r.command('precision_bench.gpu')}\n\n### Split storage and fused AdamW vs a D2D copy\n\n" +
                table(["kernel", "rounding", "ms", "GB/s", "vs D2D copy"], rows, "llrrr"))
        return f"{GPU_BEGIN}\n{body}\n{GPU_END}"
    if old is not None:
        return old
    body = ("## GPU\n\nNo GPU was present when this report was written, so there are no GPU tables yet. "
            "`bash bench/run_all.sh` adds them here when it runs on a machine where `nvidia-smi` sees a GPU "
            "(with the CUDA backend built: `precision_bench`'s `BM_CudaCopyD2D`, `BM_CudaSplit`, `BM_CudaMerge`, "
            "`BM_CudaAdamWFused`); a later CPU-only run keeps this section as it is. GPU notes per area are in "
            "[results/](results/).")
    return f"{GPU_BEGIN}\n{body}\n{GPU_END}"


def old_gpu_section(path: Path) -> str | None:
    if not path.exists():
        return None
    text = path.read_text()
    i, j = text.find(GPU_BEGIN), text.find(GPU_END)
    if i < 0 or j < i:
        return None
    section = text[i:j + len(GPU_END)]
    return None if "No GPU was present when this report was written" in section else section


# ---------------------------------------------------------------- main


def header(r: Report) -> str:
    run = r.run
    dirty = int(run.get("dirty", "0") or 0)
    untracked = int(run.get("untracked", "0") or 0)
    tree = "clean working tree" if dirty == 0 and untracked == 0 else \
        f"working tree with {dirty} modified tracked and {untracked} untracked files (built as they were)"
    total = int(run.get("total_seconds", "0") or 0)
    harness = ""
    for j in sorted(r.raw.glob("*.json")):
        try:
            ctx = json.loads(j.read_text()).get("context", {})
        except json.JSONDecodeError:
            continue
        if ctx.get("library_build_type") == "debug":
            harness = " (the Google Benchmark library installed here reports itself as a debug build; that " \
                      "affects only the harness's own overhead)"
        break
    build = int(run.get("build_seconds", "0") or 0)
    lines = [
        "# Benchmark results",
        "",
        "<!-- Generated by bench/run_all.sh (bench/report.py); edits are overwritten. -->",
        "",
        f"- Command: `{run.get('command')}` ({run.get('mode')} mode; {total // 60} min {total % 60} s in all, "
        f"of which building {build // 60} min {build % 60} s)",
        f"- Date: {run.get('date')}",
        f"- Commit: `{run.get('commit')}`, {tree}",
        f"- Machine: {run.get('cpu')}, {run.get('cores')} cores, {run.get('memory')} memory, {run.get('kernel')}; "
        f"GPU: {run.get('gpu')}",
        f"- Build: {run.get('build_type')}, {run.get('compiler')}, jemalloc linked into every bench executable; "
        f"CUDA benchmarks {'built' if run.get('cuda_benchmarks') == 'built' else 'not built'}; Google Benchmark "
        f"JSON output{harness}",
        f"- Load average (1, 5, 15 min): {run.get('load_start')} at the start, {run.get('load_end')} at the end",
        "",
        "Every ratio is between two results of the same run on the same machine. " + load_caveat(run) +
        " Per-area write-ups with the reading of each table are in [results/](results/).",
    ]
    return "\n".join(lines) + "\n"


def load_caveat(run: dict) -> str:
    """Says whether other work shared the cores, from the 1-minute load averages the run recorded."""
    def first(text: str | None) -> float:
        try:
            return float((text or "").split()[0])
        except (ValueError, IndexError):
            return float("nan")
    cores = float(run.get("cores", "0") or 0)
    peak = max(first(run.get("load_start")), first(run.get("load_end")))
    if cores > 0 and peak == peak and peak < 0.5 * cores + 1:
        return ("The machine was quiet during the run (load averages above), but it is a shared VM: absolute "
                "times vary from run to run, and the same-run ratios are what to compare.")
    return ("**Caveat:** this machine is shared and other work ran on the same cores during the run (see the "
            "load averages above and per benchmark), so absolute times, wall times above all, are noisy and "
            "slower than on a quiet machine; the tables use CPU time where the write-ups do, and the same-run "
            "ratios are what to compare.")


def summary(r: Report) -> str:
    h = r.headline
    rows = [
        ["allocator: cached alloc+free, 1 MiB (stowage / glibc, / jemalloc; CPU time)",
         f"{h.get('alloc_1m_vs_glibc', '—')}, {h.get('alloc_1m_vs_jemalloc', '—')} "
         f"({h.get('alloc_1m_ns', '—')} ns vs {h.get('alloc_1m_glibc_ns', '—')} / {h.get('alloc_1m_jemalloc_ns', '—')} ns)"],
        ["allocator: random sizes 256 B–64 MiB (glibc / stowage, jemalloc / stowage time)",
         f"{h.get('random_glibc_vs_stowage', '—')}, {h.get('random_jemalloc_vs_stowage', '—')}"],
        ["C ABI overhead (stowage_malloc / direct, 4 KiB)", h.get("capi_overhead", "—")],
        [f"split / merge vs memcpy ({h.get('split_simd', 'best SIMD')}, half_up, GB/s ratio)",
         f"{h.get('split_vs_memcpy', '—')} / {h.get('merge_vs_memcpy', '—')}"],
        ["fused AdamW speed-up vs unfused (half_up / nearest_even, f32 grads)",
         f"{h.get('adamw_speedup', '—')} / {h.get('adamw_speedup_rne', '—')}"],
        ["fused AdamW vs its traffic floor (floor time / fused time, half_up, f32 grads)",
         h.get("adamw_vs_floor", "—")],
        ["swap-attention: transfer hidden (compute = 1.25 × transfer, distance 0)",
         f"{h.get('swap_hidden', '—')}; device peak −{h.get('swap_drop', '—')} MiB of {h.get('swap_swapped', '—')} MiB swapped"],
        ["recompute: SwiGLU recompute / step MLP matmuls", h.get("recompute_step_fraction", "—")],
        ["recompute: device memory saved (32 layers, 256 tokens)", h.get("recompute_saved", "—")],
        ["host pool vs pinning per buffer (mmap+mlock / pool, 1 MiB)", h.get("pool_vs_mlock", "—")],
    ]
    return "## Headline ratios (this run)\n\n" + table(["measure", "ratio"], rows, "lr") + "\n"


def runs_table(r: Report) -> str:
    rows = []
    for meta in sorted(r.raw.glob("*.meta")):
        if meta.name == "run.meta":
            continue
        m = read_meta(meta)
        rows.append([f"`{m.get('command', meta.stem)}`", m.get("seconds", "?"), m.get("rc", "?"),
                     f"{m.get('load_before', '?')} → {m.get('load_after', '?')}"])
    missing = (r.raw / "missing").read_text().split() if (r.raw / "missing").exists() else []
    failed = (r.raw / "build_failed").read_text().split() if (r.raw / "build_failed").exists() else []
    text = "## Runs\n\nEach executable run, from `" + str(r.run.get("build_dir", "build-bench")) + "/bench/`:\n\n" + \
        table(["command", "seconds", "exit status", "load average before → after"], rows, "lrrr")
    if failed:
        text += "\n\nFailed to build: " + ", ".join(f"`{t}`" for t in failed) + "."
    if missing:
        text += "\n\nNot run (not built): " + ", ".join(f"`{t}`" for t in missing) + "."
    return text + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", type=Path, required=True, help="directory run_all.sh wrote the raw results to")
    ap.add_argument("--out", type=Path, required=True, help="the report to write")
    args = ap.parse_args()
    run = read_meta(args.raw / "run.meta")
    run.setdefault("build_dir", "build-bench")
    r = Report(args.raw, run)
    for _, fn, _ in AREAS:
        try:
            fn(r)
        except Exception as e:  # one area's broken output must not lose the others
            r.add(f"_Could not read this area's results: {type(e).__name__}: {e}_")
    # Tools with no area of their own above: their markdown, verbatim, under the area their name
    # starts with, else under "Other tools".
    extra: dict[str, list[str]] = {}
    for t in run.get("tools", "").split():
        if t in HANDLED_TOOLS:
            continue
        area = next((a for a, _, prefixes in AREAS if any(t.startswith(p) for p in prefixes)), "other")
        before = len(r.parts)
        tool_section(r, t, f"`{t}`")
        extra.setdefault(area, []).extend(r.parts[before:])
        del r.parts[before:]
    # Place each area's extra tools after that area's own tables.
    body: list[str] = []
    current = None
    for part in r.parts:
        m = re.match(r"## (\w+)", part)
        if m:
            if current in extra:
                body += extra.pop(current)
            current = next((a for a, _, _ in AREAS if part.lower().startswith(f"## {a}")), None)
        body.append(part)
    if current in extra:
        body += extra.pop(current)
    for parts in extra.values():
        if parts:
            body.append("## Other tools\n")
            body += parts
    out = [header(r), summary(r)] + body + [gpu_section(r, old_gpu_section(args.out)) + "\n", runs_table(r)]
    args.out.write_text("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
