"""Host memory for a CUDA tensor's bytes: stowage's pinned host pool of that device (pages on
the NUMA node(s) nearest the GPU, pinned once and reused; docs/host_pool.md), as a CPU tensor.
The pool does not order reuse by streams, so what copies or kernels still use is held until they
are done (Holds)."""
import collections
import threading
import warnings

import torch

from .. import _lib, memory
from .. import dlpack as stowage_memory


def pool_tensor(shape, dtype, device_index):
    """A CPU tensor of any dtype in the host pool of stowage's device `device_index`: the pool's
    bytes viewed as `dtype` (so complex, float8 and unsigned types need no DLPack type)."""
    shape = tuple(shape)
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    raw = torch.from_dlpack(stowage_memory.host_empty((nbytes,), "uint8", device=device_index))
    return raw.view(dtype).view(shape)


def cuda_index(device):
    """The index of a CUDA torch.device; "cuda" without one means the current device, as in torch."""
    return device.index if device.index is not None else torch.cuda.current_device()


_warned = []


def pinned_empty(shape, dtype, device):
    """A CPU tensor for the bytes of a tensor on `device` (a CUDA torch.device): from stowage's
    host pool of that device where libstowage uses CUDA, else (warned once) PyTorch's pinned
    memory, which orders its own reuse."""
    if memory.using_cuda():
        return pool_tensor(shape, dtype, cuda_index(device))
    if not _warned:
        _warned.append(True)
        warnings.warn(f"stowage.torch: {_lib.path()} is not using CUDA (built without CUDA, no usable GPU, or "
                      "STOWAGE_DEVICE=emulated): CUDA tensors' host copies go to PyTorch's pinned memory, not "
                      "stowage's NUMA-aware host pool", RuntimeWarning, stacklevel=3)
    return torch.empty(shape, dtype=dtype, pin_memory=True)


class Holds:
    """Tensors kept alive until a CUDA event is done: the pool may hand their bytes out again only
    after the copies that read or write them have ended. Checked (never waited for) at each hold;
    forward's pack hooks and autograd's threads both hold, hence the lock."""

    def __init__(self):
        self._held = collections.deque()  # (event, tensor), oldest first
        self._lock = threading.Lock()

    def hold(self, event, tensor):
        with self._lock:
            self._held.append((event, tensor))
            self._let_go()

    def prune(self):
        """Lets go of what finished copies held: before taking a buffer, so the pool can hand out
        one of those rather than pin a new block."""
        with self._lock:
            self._let_go()

    def _let_go(self):
        while self._held and self._held[0][0].query():
            self._held.popleft()

    def __len__(self):
        return len(self._held)
