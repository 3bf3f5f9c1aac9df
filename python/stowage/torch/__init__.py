"""stowage as PyTorch's CUDA allocator: `import stowage.torch; stowage.torch.enable()` before the
first CUDA allocation, and the training loop stays as it is (docs/pytorch.md).

enable() compiles a small shim against the installed torch at first use (cached per torch
version under ~/.cache/stowage) that wires record_stream, empty_cache, the memory fraction and
out-of-memory errors to stowage. Without a compiler it falls back to torch's plain pluggable
allocator and warns once, naming what is then unsafe.
"""
import hashlib
import sys
import os
import warnings

from .. import _lib, memory
from ..errors import StowageError

_enabled = None  # "shim" or "plain" once enable() succeeded

# torch.utils.cpp_extension.load compiles at -O0 unless told otherwise; the shim runs on every
# allocation and free, and at -O0 its std::function thunks alone cost tens of ns a pair.
SHIM_CFLAGS = ["-O2"]

# What the plain CUDAPluggableAllocator cannot do (its setters exist only in C++).
UNSAFE_WITHOUT_SHIM = (
    "tensor.record_stream() is not seen, so a block used on a side stream (DDP/FSDP buckets, NCCL, "
    "prefetch) can be handed out again while that stream still reads it; torch.cuda.empty_cache() and "
    "set_per_process_memory_fraction() do nothing; an exhausted allocation is a NULL pointer (a later "
    "illegal-address fault), not torch.cuda.OutOfMemoryError")


def _torch():
    try:
        import torch
    except ImportError as e:
        raise StowageError("stowage.torch needs PyTorch; the rest of stowage works without it") from e
    return torch


def _version_tuple(v):
    parts = []
    for p in v.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def shim_source():
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_shim", "torch_allocator.cpp")


def _cache_dir(torch, library):
    # One build per torch, CUDA, Python, shim source, flags and library: a new torch gets a new build.
    with open(shim_source(), "rb") as f:
        key = f.read() + os.path.realpath(library).encode() + " ".join(SHIM_CFLAGS).encode()
    digest = hashlib.sha256(key).hexdigest()[:12]
    tag = f"torch{torch.__version__}-cuda{torch.version.cuda}-py{sys.version_info[0]}{sys.version_info[1]}"
    tag = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in tag)
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "stowage", "torch-shim", f"{tag}-{digest}"), digest


def build_shim(verbose=False):
    """Compiles (or loads the cached) shim module for the installed torch; returns it."""
    torch = _torch()
    from torch.utils import cpp_extension

    library = _lib.path()
    directory, digest = _cache_dir(torch, library)
    os.makedirs(directory, exist_ok=True)
    return cpp_extension.load(
        name=f"stowage_torch_shim_{digest}",
        sources=[shim_source()],
        extra_include_paths=[os.path.dirname(shim_source())],
        extra_cflags=SHIM_CFLAGS,
        extra_ldflags=[os.path.realpath(library), f"-Wl,-rpath,{os.path.dirname(os.path.realpath(library))}"],
        build_directory=directory,
        with_cuda=True,
        verbose=verbose)


def enable(shim=True, verbose=False):
    """Makes stowage PyTorch's CUDA allocator. Call it before the first CUDA allocation.

    shim=True compiles the safe shim (falling back, with one warning, when it cannot be built);
    shim="required" raises instead of falling back; shim=False uses the plain pluggable
    allocator (with the same warning). Returns "shim" or "plain"."""
    global _enabled
    if _enabled is not None:
        return _enabled
    torch = _torch()
    if _version_tuple(torch.__version__) < (2, 0):
        raise StowageError(f"stowage.torch.enable() needs PyTorch 2.0 or newer (CUDAPluggableAllocator); "
                           f"this is {torch.__version__}")
    if not torch.cuda.is_available():
        raise StowageError("stowage.torch.enable(): PyTorch sees no CUDA device, and the drop-in replaces "
                           "PyTorch's CUDA allocator; without CUDA use stowage's own API (stowage.empty, "
                           "stowage.memory_stats)")
    if not memory.using_cuda():
        raise StowageError(f"stowage.torch.enable(): {_lib.path()} is not using CUDA (built without CUDA, or "
                           "STOWAGE_DEVICE=emulated)")
    if shim:
        try:
            module = build_shim(verbose=verbose)
        except Exception as e:  # no compiler, no CUDA headers, a torch without the C++ API
            if shim == "required":
                raise StowageError(f"stowage.torch.enable(): the shim did not build: {e}") from e
            reason = f"the shim did not build ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        else:
            module.install()
            _enabled = "shim"
            return _enabled
    else:
        reason = "shim=False"
    warnings.warn(f"stowage: using PyTorch's plain pluggable allocator because {reason}; then "
                  f"{UNSAFE_WITHOUT_SHIM}", RuntimeWarning, stacklevel=2)
    plain = torch.cuda.memory.CUDAPluggableAllocator(_lib.path(), "stowage_malloc", "stowage_free")
    torch.cuda.memory.change_current_allocator(plain)
    _enabled = "plain"
    return _enabled


def enabled():
    """None, "shim" or "plain": how stowage is PyTorch's allocator in this process."""
    return _enabled


def _device(device):
    if device is None:
        # torch.cuda's current device, as torch.cuda.memory_stats() reads; a torch without CUDA has
        # none (current_device() raises), and stowage's devices are then emulated: device 0, as the
        # package's own readers default to.
        cuda = _torch().cuda
        return cuda.current_device() if cuda.is_available() else 0
    if isinstance(device, int):
        return device
    index = getattr(_torch().device(device), "index", None)
    return _device(None) if index is None else index  # "cuda": the current device, as torch reads it


# PyTorch-style readers (torch.cuda.memory_stats() raises under a pluggable allocator).
def memory_stats(device=None):
    return memory.memory_stats(_device(device))


def memory_allocated(device=None):
    return memory.memory_allocated(_device(device))


def max_memory_allocated(device=None):
    return memory.max_memory_allocated(_device(device))


def memory_reserved(device=None):
    return memory.memory_reserved(_device(device))


def max_memory_reserved(device=None):
    return memory.max_memory_reserved(_device(device))


def reset_peak_memory_stats(device=None):
    memory.reset_peak_memory_stats(_device(device))


def snapshot(device=None):
    return memory.snapshot(_device(device))


def empty_cache():
    memory.empty_cache()


tag = memory.tag
