"""Host memory for a CUDA tensor's bytes: stowage's pinned host pool of that device (pages on
the NUMA node(s) nearest the GPU, pinned once and reused; docs/host_pool.md), as a CPU tensor.
The pool does not order reuse by streams, so what copies or kernels still use is held until they
are done (Holds)."""
import collections

import torch

from .. import _lib, memory
from .. import dlpack as stowage_memory
from ..errors import StowageError


def pinned_empty(shape, dtype, device):
    """A CPU tensor in the host pool of `device` (a CUDA torch.device)."""
    if not memory.using_cuda():
        raise StowageError(f"stowage.torch: a CUDA tensor's host memory comes from stowage's pinned host pool, but "
                           f"{_lib.path()} is not using CUDA (built without CUDA, no usable GPU, or "
                           "STOWAGE_DEVICE=emulated)")
    as_bytes = dtype == torch.bool  # older PyTorch reads no DLPack bool
    host = torch.from_dlpack(stowage_memory.host_empty(tuple(shape), torch.uint8 if as_bytes else dtype,
                                                       device=device.index if device.index is not None else 0))
    return host.view(torch.bool) if as_bytes else host


class Holds:
    """Tensors kept alive until a CUDA event is done: the pool may hand their bytes out again only
    after the copies that read or write them have ended. Checked (never waited for) at each hold."""

    def __init__(self):
        self._held = collections.deque()  # (event, tensor), oldest first

    def hold(self, event, tensor):
        self._held.append((event, tensor))
        while self._held and self._held[0][0].query():
            self._held.popleft()

    def __len__(self):
        return len(self._held)
