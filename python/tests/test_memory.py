"""The ctypes layer: allocation, statistics under PyTorch's names, tags, snapshots, caps."""
import ctypes
import os
import json

import pytest

import stowage

MiB = 1 << 20


def test_raw_alloc_counts_exact_bytes_and_frees_back():
    before = stowage.memory_stats()
    p = stowage.raw_alloc(3 * MiB)
    assert p != 0
    during = stowage.memory_stats()
    assert during["allocated_bytes.all.current"] - before["allocated_bytes.all.current"] == 3 * MiB
    assert during["requested_bytes.all.current"] - before["requested_bytes.all.current"] == 3 * MiB
    assert during["allocation.all.current"] - before["allocation.all.current"] == 1
    if not stowage.using_cuda():  # emulated memory is the host's: write and read it back
        ctypes.memset(p, 0x5A, 3 * MiB)
        assert ctypes.string_at(p + 3 * MiB - 4, 4) == b"\x5a" * 4
    stowage.raw_free(p, 3 * MiB)
    after = stowage.memory_stats()
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert stowage.raw_alloc(0) == 0


def test_stats_use_pytorch_names_sorted():
    stats = stowage.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.large_pool.peak", "reserved_bytes.all.peak",
                "active_bytes.small_pool.freed", "inactive_split_bytes.all.current", "requested_bytes.all.allocated",
                "num_alloc_retries", "num_ooms", "segment.all.current"):
        assert key in stats, key
    assert list(stats) == sorted(stats)
    assert stowage.memory_allocated() == stats["allocated_bytes.all.current"]
    assert stowage.memory_reserved() == stats["reserved_bytes.all.current"]


def test_peaks_reset_to_current():
    p = stowage.raw_alloc(8 * MiB)
    stowage.raw_free(p, 8 * MiB)
    assert stowage.max_memory_allocated() >= 8 * MiB
    stowage.reset_peak_memory_stats()
    assert stowage.max_memory_allocated() == stowage.memory_allocated()
    assert stowage.max_memory_reserved() == stowage.memory_reserved()


def live_tags(snap):
    return sorted((b["tag"], b["requested_size"]) for s in snap["segments"] for b in s["blocks"]
                  if b["state"] == "active_allocated")


def test_tags_nest_and_reach_the_snapshot(tmp_path):
    base = live_tags(stowage.snapshot())
    with stowage.tag("layer0"):
        a = stowage.raw_alloc(4096 + 1)
        with stowage.tag("layer0.attn"):
            b = stowage.raw_alloc(4096 + 2)
        c = stowage.raw_alloc(4096 + 3)
    d = stowage.raw_alloc(4096 + 4)
    snap = stowage.snapshot()
    added = [t for t in live_tags(snap) if t not in base]
    assert added == [("", 4100), ("layer0", 4097), ("layer0", 4099), ("layer0.attn", 4098)]
    path = tmp_path / "snap.json"
    stowage.dump_snapshot(path)
    assert live_tags(json.loads(path.read_text())) == live_tags(snap)
    for p, n in ((a, 4097), (b, 4098), (c, 4099), (d, 4100)):
        stowage.raw_free(p, n)


def test_empty_cache_returns_reserved_memory():
    stowage.empty_cache()
    reserved = stowage.memory_reserved()
    p = stowage.raw_alloc(64 * MiB)
    stowage.raw_free(p, 64 * MiB)
    assert stowage.memory_reserved() >= reserved + 64 * MiB  # cached, not given back
    stowage.empty_cache()
    assert stowage.memory_reserved() == reserved
    stowage.empty_cache(0)


def test_memory_fraction_caps_reserved_bytes():
    capacity = stowage.device_capacity()
    assert capacity > 0
    stowage.empty_cache()
    try:
        stowage.set_per_process_memory_fraction(0.25)
        with pytest.raises(stowage.OutOfMemoryError) as e:
            stowage.raw_alloc(capacity // 4 + 64 * MiB)
        assert "memory cap" in str(e.value)
        p = stowage.raw_alloc(capacity // 8)
        stowage.raw_free(p, capacity // 8)
    finally:
        stowage.set_memory_cap(0)
        stowage.empty_cache()


def test_the_first_call_of_a_fresh_interpreter_in_another_folder(tmp_path):
    # Built with TLS descriptors, the C ABI's first thread-local access in a thread went through
    # glibc's slow path, which (before glibc 2.40) clobbered a vector register holding the entry
    # point's arguments: this crashed every time from another working folder.
    import subprocess
    import sys
    from conftest import PACKAGE_ROOT
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT, STOWAGE_LIBRARY=os.path.abspath(stowage.library_path()))
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", "import stowage; print(len(stowage.memory_stats(0)))"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (r.returncode, r.stderr)
        assert int(r.stdout) > 0
