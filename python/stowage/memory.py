"""The allocator from Python: raw blocks, statistics in PyTorch's key names, snapshots, caps,
tags and empty_cache. Devices are stowage's process-wide ones (CUDA, else emulated)."""
import collections
import contextlib
import ctypes
import json
import os

from . import _lib
from .errors import InvalidArgumentError


def device_count():
    """How many devices the ordinals may name."""
    return _lib.call_int("stowage_device_count")


def using_cuda():
    """True when the ordinals name CUDA devices, False for emulated devices (host memory)."""
    return _lib.call_int("stowage_using_cuda") == 1


def device_capacity(device=0):
    """The device's memory in bytes."""
    return _lib.call_int("stowage_device_capacity", device)


def raw_alloc(size, device=0, stream=0):
    """`size` bytes on `stream` (a cudaStream_t as an int, 0 = the default stream); the address
    as an int, 0 for size 0. OutOfMemoryError carries stowage's report."""
    if size == 0:
        return 0
    ptr = _lib.library().stowage_malloc(size, device, stream or None)
    _lib.check(ptr, lambda p: not p)
    return ptr


def raw_free(ptr, size, device=0):
    """Returns a block from raw_alloc; `size` must be the size it was asked with (or the size of the
    block the allocator gave, larger than the rounded request when a cached block was reused whole,
    or 0 for "unknown"): another size changes nothing and is refused."""
    lib = _lib.library()
    lib.stowage_free(ptr or None, size, device, None)
    _lib.check(None, lambda _: lib.stowage_last_error_code() != 0)


def record_stream(ptr, stream, device=-1):
    """The block at `ptr` is also used on `stream`: not reused before that stream's work so far."""
    _lib.call_int("stowage_record_stream", ptr, device, stream or None)


def memory_stats(device=0):
    """The allocator's statistics under PyTorch's names ("allocated_bytes.all.current", ...),
    sorted by name as torch.cuda.memory_stats() returns them."""
    flat = json.loads(_lib.read_text("stowage_get_stats", device))
    return collections.OrderedDict(sorted(flat.items()))


def memory_allocated(device=0):
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=0):
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=0):
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=0):
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=0):
    _lib.call_int("stowage_reset_peak_stats", device)


def empty_cache(device=None):
    """Gives cached, unused memory back to the device (every device when None)."""
    _lib.call_int("stowage_empty_cache", -1 if device is None else device)


def snapshot(device=0):
    """The allocator's snapshot as a dict (segments, blocks with their tags, trace; docs/snapshot.md)."""
    return json.loads(_lib.read_text("stowage_snapshot_json", device))


def dump_snapshot(path, device=0):
    """Writes the snapshot as JSON to `path` (str, bytes or os.PathLike), for `stowage inspect`."""
    _lib.call_int("stowage_snapshot", device, _c_string(os.fsencode(path), "dump_snapshot: path"))


def set_memory_cap(nbytes, device=0):
    """Caps the bytes the allocator reserves (0 removes the cap)."""
    if nbytes < 0:
        raise InvalidArgumentError(f"set_memory_cap: {nbytes} is negative")
    _lib.call_int("stowage_set_memory_cap", device, nbytes)


def set_per_process_memory_fraction(fraction, device=0):
    """Caps reserved bytes at `fraction` (0 <= fraction <= 1) of the device's memory, as PyTorch's
    set_per_process_memory_fraction: 1 removes the cap, 0 refuses every new reservation."""
    _lib.call_int("stowage_set_memory_fraction", device, ctypes.c_double(fraction))


def host_stats(device=0):
    """The pinned host pool of `device` (stowage.host_empty's memory): backend, pinned_bytes,
    in_use_bytes, requested_bytes and their peaks, live_buffers, counts, per NUMA node."""
    return json.loads(_lib.read_text("stowage_host_stats", device))


def host_device_pointer(ptr, device=0):
    """The address `device`'s kernels use for the host pool buffer at `ptr` (on CUDA the same
    where the GPU addresses registered host memory by its host pointer, else its mapped alias)."""
    addr = _lib.library().stowage_host_device_pointer(ptr, device)
    return _lib.check(addr, lambda a: not a)


def host_release_unused(device=0):
    """Unpins and unmaps the host pool's pages that no live buffer uses; the bytes given back."""
    return _lib.call_int("stowage_host_release_unused", device)


def _c_string(text, what):
    """bytes for a C string: a NUL inside would end it early (a path or tag cut short in silence)."""
    if b"\0" in text:
        raise InvalidArgumentError(f"{what}: {text!r} contains a NUL byte")
    return text


@contextlib.contextmanager
def tag(name):
    """Every block allocated on this thread inside the block records `name` (str, or bytes as
    they are; nests)."""
    _lib.call_int("stowage_push_tag", _c_string(name if isinstance(name, bytes) else str(name).encode(), "tag"))
    try:
        yield
    finally:
        _lib.call_int("stowage_pop_tag")
