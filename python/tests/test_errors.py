"""Every bad input gets a clear error of its own class and changes nothing."""
import pytest

import stowage
from stowage import precision

MiB = 1 << 20


def current():
    """What the allocator holds now (the cumulative counters move with every call)."""
    return {k: v for k, v in stowage.memory_stats().items() if k.endswith(".current")}


def refused(error, match, call, *args):
    """`call(*args)` raises `error` whose message matches, holding the same memory as before."""
    before = current()
    with pytest.raises(error, match=match) as e:
        call(*args)
    assert current() == before
    return e.value


def test_bad_frees_are_refused():
    p = stowage.raw_alloc(4096)
    on_the_side = stowage.raw_alloc(MiB)
    refused(stowage.InvalidArgumentError, "4095", stowage.raw_free, p, 4095)  # wrong size
    refused(stowage.InvalidArgumentError, "", stowage.raw_free, on_the_side + 512, 512)  # inside a block
    refused(stowage.InvalidArgumentError, "negative size", stowage.raw_free, p, -4096)
    refused(stowage.InvalidArgumentError, "never gave out", stowage.raw_free, 0x1000, 4096)  # foreign
    stowage.raw_free(p, 4096)
    refused(stowage.InvalidArgumentError, "double free", stowage.raw_free, p, 4096)
    stowage.raw_free(on_the_side, MiB)
    # The size asked for, the rounded size given (1000 -> 1024) or 0 (unknown) free it; another does not.
    for given in (1000, 1024, 0):
        q = stowage.raw_alloc(1000)
        refused(stowage.InvalidArgumentError, "999", stowage.raw_free, q, 999)
        stowage.raw_free(q, given)


def test_bad_allocations_are_refused():
    refused(stowage.InvalidArgumentError, "negative size", stowage.raw_alloc, -5)
    refused(stowage.InvalidArgumentError, "device 57", stowage.raw_alloc, 16, 57)
    oom = refused(stowage.OutOfMemoryError, "out of memory", stowage.raw_alloc, stowage.device_capacity() * 4)
    assert "capacity" in str(oom)  # stowage's whole report
    refused(stowage.InvalidArgumentError, "dtype", stowage.empty, (2, 2), "complex64")
    refused(stowage.InvalidArgumentError, "non-negative", stowage.empty, (2, -2))
    refused(stowage.InvalidArgumentError, "overflows", stowage.empty, (1 << 40, 1 << 40))


def test_bad_streams_tags_and_caps_are_refused():
    p = stowage.raw_alloc(4096)
    refused(stowage.InvalidArgumentError, "not a live stowage block", stowage.record_stream, p + 8, 0)
    if not stowage.using_cuda():  # CUDA cannot tell every non-handle from a stream
        refused(stowage.InvalidArgumentError, "stream", stowage.record_stream, p, 0xDEAD0)
    stowage.record_stream(p, 0)  # the default stream is real
    stowage.raw_free(p, 4096)
    refused(stowage.InvalidArgumentError, "no tag was pushed", stowage._lib.call_int, "stowage_pop_tag")
    refused(stowage.InvalidArgumentError, "not in", stowage.set_per_process_memory_fraction, 1.5)
    refused(stowage.InvalidArgumentError, "not in", stowage.set_per_process_memory_fraction, float("nan"))
    refused(ValueError, "negative", stowage.set_memory_cap, -1)
    refused(stowage.InvalidArgumentError, "no path", stowage.dump_snapshot, "")


def test_integers_that_do_not_fit_their_c_type_are_refused_not_wrapped():
    """ctypes converts an int modulo the C type's width: raw_alloc(2**64 + 100) allocated 100 bytes,
    set_memory_cap(2**64) removed the cap and device 2**32 was device 0."""
    refused(stowage.InvalidArgumentError, r"stowage_malloc: argument 1: 18446744073709551716 does not fit a C "
            r"signed 64-bit integer", stowage.raw_alloc, 2**64 + 100)
    refused(stowage.InvalidArgumentError, "argument 2: 4294967296 does not fit a C signed 32-bit integer",
            stowage.raw_alloc, 16, 2**32)
    refused(stowage.InvalidArgumentError, "does not fit an address", stowage.raw_free, 2**64 + 4096, 4096)
    refused(stowage.InvalidArgumentError, "does not fit a C unsigned 64-bit integer", stowage.set_memory_cap, 2**64)
    cap = 1 << 30
    stowage.set_memory_cap(cap)  # the cap stays what it was after a refusal
    refused(stowage.InvalidArgumentError, "does not fit", stowage.set_memory_cap, 2**64 + MiB)  # was a 1 MiB cap
    p = stowage.raw_alloc(2 * MiB)  # under the 1 GiB cap
    stowage.raw_free(p, 2 * MiB)
    refused(stowage.OutOfMemoryError, "", stowage.raw_alloc, cap + MiB)  # over it
    stowage.set_memory_cap(0)
    planes = precision.planes(0, 0, 0, 0, "half_up")
    refused(stowage.InvalidArgumentError, "adam_step: step: 18446744073709551657", precision.adam_step,
            planes, 0, 32, 0, 0, 2**64 + 41, 0.1)
    refused(stowage.InvalidArgumentError, "planes: numel", precision.planes, 0, 0, 0, 2**64, "half_up")
    refused(stowage.InvalidArgumentError, "planes: bf16", precision.planes, 2**64 + 4096, 0, 0, 1, "half_up")
    refused(stowage.InvalidArgumentError, "step_tensors: grad", precision.step_tensors,
            [(planes, 2**64 + 64, 32, 0, 0, 0)])
    # A shape's dimensions are C int64_t: 2**64 + 5 was taken as 5.
    refused(stowage.InvalidArgumentError, "stowage.empty: shape", stowage.empty, (2**64 + 5,), "uint8")
    refused(stowage.InvalidArgumentError, "stowage.host_empty: shape", stowage.host_empty, (2**64 + 5, 3))
    # Integers of other types (numpy's) are checked as ctypes takes them (through __index__).
    np = pytest.importorskip("numpy")
    refused(stowage.InvalidArgumentError, "4294967296 does not fit", stowage.raw_alloc, 16, np.int64(2**32))
    p = stowage.raw_alloc(np.int64(4096))
    stowage.raw_free(p, np.uint64(4096))


def test_paths_and_tags_with_a_nul_byte_are_refused_and_bytes_are_taken_as_they_are(tmp_path):
    refused(stowage.InvalidArgumentError, "NUL", stowage.dump_snapshot, str(tmp_path / "cut\0.json"))
    assert list(tmp_path.iterdir()) == []  # nothing written under the name cut short
    with pytest.raises(stowage.InvalidArgumentError, match="tag: .*NUL"):
        with stowage.tag("layer1\0.attn"):
            pass
    stowage.dump_snapshot(bytes(tmp_path / "b.json"))  # a bytes path is the path, not its repr
    assert (tmp_path / "b.json").exists()
    with stowage.tag(b"bytes.tag"):
        p = stowage.raw_alloc(4096)
    tags = [b["tag"] for s in stowage.snapshot()["segments"] for b in s["blocks"] if b["address"] == p]
    stowage.raw_free(p, 4096)
    assert tags == ["bytes.tag"]


def test_a_tag_is_popped_when_its_block_raises():
    with pytest.raises(stowage.InvalidArgumentError):
        with stowage.tag("doomed"):
            stowage.raw_alloc(-1)
    p = stowage.raw_alloc(4096 + 7)
    tags = [b["tag"] for s in stowage.snapshot()["segments"] for b in s["blocks"] if b["requested_size"] == 4096 + 7]
    assert tags == [""]
    stowage.raw_free(p, 4096 + 7)


def test_the_first_failure_reaches_stderr_once(python):
    r = python("import stowage\n"
               "for n in (-1, -2, -3):\n"
               "    try: stowage.raw_alloc(n)\n"
               "    except stowage.InvalidArgumentError: pass\n")
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("stowage")]
    assert len(lines) == 1, r.stderr
    assert "negative size -1" in lines[0] and "first error of this process" in lines[0]


def test_a_pytorch_alloc_conf_works_and_says_what_it_ignores(python):
    conf = "expandable_segments:True,roundup_power2_divisions:[256:1,512:2,1024:4,>:8],backend:native"
    r = python("import stowage\np = stowage.raw_alloc(4096)\nstowage.raw_free(p, 4096)\nprint('ok')",
               env={"STOWAGE_ALLOC_CONF": conf})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    warned = [l for l in r.stderr.splitlines() if "PyTorch's own setting" in l]
    assert len(warned) == 2, r.stderr
    assert "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]" in warned[0]


def test_a_malformed_alloc_conf_is_a_config_error_naming_the_variable(python):
    r = python("import stowage\n"
               "try: stowage.raw_alloc(4096)\n"
               "except stowage.ConfigError as e: print('ConfigError:', e)\n",
               env={"STOWAGE_ALLOC_CONF": "expandable_segments:maybe"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ConfigError: STOWAGE_ALLOC_CONF: allocator options: expandable_segments"), r.stdout


def test_a_missing_library_names_where_it_looked(python):
    r = python("import stowage\n"
               "try: stowage.memory_stats()\n"
               "except stowage.StowageError as e: print(e)\n",
               env={"STOWAGE_LIBRARY": "/nonexistent/libstowage.so"})
    assert r.returncode == 0, r.stderr
    assert "cannot load libstowage: tried /nonexistent/libstowage.so" in r.stdout, r.stdout
