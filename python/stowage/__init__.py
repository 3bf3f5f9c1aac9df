"""stowage: memory management for large-model training.

The allocator through its C ABI (plain ctypes: any Python 3, with or without PyTorch):
statistics in PyTorch's names, snapshots, tags, caps, and tensors exported through DLPack (in
device memory, or in the pinned host pool).
`stowage.torch.enable()` makes stowage PyTorch's CUDA allocator (docs/pytorch.md).
"""
from .errors import (ConfigError, DeviceError, InvalidArgumentError, OutOfMemoryError, StowageError,
                     UnsupportedError)
from .memory import (device_capacity, device_count, dump_snapshot, empty_cache, host_release_unused, host_stats,
                     max_memory_allocated, max_memory_reserved, memory_allocated, memory_reserved, memory_stats,
                     raw_alloc, raw_free, record_stream, reset_peak_memory_stats, set_memory_cap,
                     set_per_process_memory_fraction, snapshot, tag, using_cuda)
from .dlpack import Buffer, empty, host_empty
from ._lib import path as library_path

__version__ = "0.1.0"
