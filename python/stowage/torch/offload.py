"""Where the shared-storage optimizers keep their state (m and v, or SGD's momentum buffer):
state_offload and state_device_budget of SharedStorageAdamW / SharedStorageSGD (docs/pytorch_optimizers.md,
"Optimizer-state offload").

"device"    the state is a tensor on the parameter's device (what torch.optim does).
"mapped"    a CUDA parameter's state lives in stowage's pinned host pool of its device (pages on
            the NUMA node(s) nearest the GPU, registered mapped: under unified addressing the host
            pointer is valid in device kernels) and the fused kernel reads and writes it over the
            link: no device bytes.
"streamed"  the state lives in the same pinned host pool; at each step one parameter at a time is copied
            into a device scratch, stepped and copied back, on PyTorch's current stream. One
            scratch per device, the size of the largest streamed parameter's state.

The budget: per device, parameters in order keep their state on the device when it fits in what
is left, the others get the offload placement. Streamed first sets the scratch aside from the
budget (for the largest state among the group's parameters), and only when some state must
leave, so the device bytes of state never exceed the budget.

CPU parameters' state is host memory already. To test the mechanism without a GPU, the CPU path
keeps "device" state in PyTorch's memory and offloaded state in stowage's memory (an emulated
device's: host memory PyTorch's allocator does not own, as stowage.torch.swap does), so the bytes
PyTorch holds drop by what is offloaded; the kernel reads mapped state there directly and streamed
state through a scratch in PyTorch's memory. Where libstowage uses CUDA its memory is a GPU's, so
CPU parameters' offloaded state is then plain CPU memory: the same numbers and bookkeeping, and
PyTorch's bytes do not drop (as stowage.torch.swap does for CPU tensors there).
"""
import contextlib
import numbers
import weakref

import torch

from .. import dlpack as stowage_memory
from .. import memory
from ..errors import InvalidArgumentError, UnsupportedError
from ._pinned import cuda_index, pinned_empty, pool_tensor

PLACEMENTS = ("none", "mapped", "streamed")


def check_options(state_offload, state_device_budget):
    """InvalidArgumentError for an unknown placement or a budget that is not a byte count."""
    if not isinstance(state_offload, str) or state_offload not in PLACEMENTS:
        raise InvalidArgumentError(f"state_offload {state_offload!r} is not one of {', '.join(PLACEMENTS)}")
    if state_device_budget is None:
        return
    if isinstance(state_device_budget, bool) or not isinstance(state_device_budget, numbers.Integral) or \
            state_device_budget < 0:
        raise InvalidArgumentError(f"state_device_budget must be a number of bytes >= 0 or None (got "
                                   f"{state_device_budget!r})")
    if state_offload == "none":
        raise InvalidArgumentError("state_device_budget decides which state leaves the device: give "
                                   "state_offload='mapped' or 'streamed' with it")


def _check_mapped(device):
    """Refuses mapped state on a GPU that would address the host pool's memory through another
    pointer than the host's: the fused kernels are given the tensors' own pointers."""
    if not memory.using_cuda() or device in _MAPPED_CHECKED:
        return  # PyTorch's pinned memory (cudaHostAlloc) is addressed by its host pointer
    index = cuda_index(device)
    probe = pool_tensor((1,), torch.uint8, index)
    if memory.host_device_pointer(probe.data_ptr(), index) != probe.data_ptr():
        raise UnsupportedError(f"state_offload='mapped': {device} addresses pinned host memory through another "
                               "pointer than the host's, and the fused kernels are given the host's; use "
                               "state_offload='streamed'")
    _MAPPED_CHECKED.add(device)


_MAPPED_CHECKED = set()


class StateHomes:
    """The placement of each parameter's state, the budget's books, and the streamed scratch."""

    def __init__(self, mode, budget, tensors_per_param):
        check_options(mode, budget)
        self.mode, self.budget, self.tensors = mode, budget, tensors_per_param
        self._where = {}    # id(param) -> "device" | "mapped" | "streamed"
        self._books = {}    # device -> (budget left, bytes set aside for the scratch, bytes it must hold)
        self._scratch = {}  # device -> one flat fp32 tensor on that device
        self._made = weakref.WeakValueDictionary()  # address -> an offloaded state tensor new() made there

    def state_bytes(self, p):
        return 4 * self.tensors * p.numel()

    # --- the plan: pure, so a refusal decides nothing ---
    def plan(self, params, books=None):
        """The placements of one param group's parameters, in order, and the books after them."""
        books = dict(self._books if books is None else books)
        if self.mode == "none":
            return ["device"] * len(params), books
        out = [None] * len(params)
        for dev in dict.fromkeys(p.device for p in params):
            mine = [i for i, p in enumerate(params) if p.device == dev]
            sizes = {i: self.state_bytes(params[i]) for i in mine}
            left, reserve, need = books.get(dev, (self.budget, 0, 0))
            if left is not None and self.mode == "streamed" and sum(sizes.values()) > left:
                # Some state must leave: the scratch comes out of the budget first.
                largest = max(sizes.values())
                extra = max(0, largest - reserve)
                if extra > left:
                    raise InvalidArgumentError(
                        f"state_device_budget {self.budget}: streaming needs a scratch of {largest} bytes on {dev} "
                        f"(the largest parameter's state), {extra} more than set aside so far, and {left} bytes of "
                        "the budget are left")
                left, reserve = left - extra, max(reserve, largest)
            for i in mine:
                if left is not None and sizes[i] <= left:
                    out[i], left = "device", left - sizes[i]
                else:
                    out[i] = self.mode
                    if self.mode == "streamed":
                        need = max(need, sizes[i])
            books[dev] = (left, reserve, need)
            if dev.type == "cuda" and self.mode == "mapped" and "mapped" in (out[i] for i in mine):
                _check_mapped(dev)
        return out, books

    def plan_groups(self, groups):
        """Refuses (before anything moves) a budget the groups' parameters, in order, cannot keep."""
        books = self._books
        for params in groups:
            _, books = self.plan(params, books)

    def commit(self, params, placements, books):
        for p, where in zip(params, placements):
            self._where[id(p)] = where
        self._books = books

    def placement(self, p):
        return self._where[id(p)]

    # --- the state's memory ---
    def new(self, p, value=None):
        """A state tensor of p's shape in its home: zeros, or a copy of `value` (its values in fp32)."""
        where = self._where.get(id(p), "device")
        if where == "device":
            t = torch.empty(p.shape, dtype=torch.float32, device=p.device)
        elif p.device.type == "cuda":
            t = pinned_empty(p.shape, torch.float32, p.device)
        elif memory.using_cuda():  # stowage's memory is a GPU's: CPU tensors cannot use it
            t = torch.empty(p.shape, dtype=torch.float32)
        else:
            t = torch.from_dlpack(stowage_memory.empty(tuple(p.shape), "float32"))
        if where != "device":
            self._made[t.data_ptr()] = t
        return t.zero_() if value is None else t.copy_(value.detach().to(torch.float32))

    def holds(self, p, t):
        """t is state the fused kernel may be given by address for p: fp32, contiguous, p's shape,
        on p's device, or for offloaded state a tensor new() made (a CUDA kernel reaches host
        memory only where it is mapped)."""
        if not (isinstance(t, torch.Tensor) and t.layout == torch.strided and t.dtype == torch.float32
                and t.shape == p.shape and t.is_contiguous()):
            return False
        if self._where.get(id(p), "device") == "device":
            return t.device == p.device
        return self._made.get(t.data_ptr()) is t

    def home_devices(self, p):
        """The devices a tensor of values for p's state may come from (new() copies it home)."""
        return {p.device} if self._where.get(id(p), "device") == "device" else {p.device, torch.device("cpu")}

    @contextlib.contextmanager
    def working(self, p, tensors):
        """The tensors the kernel updates: the state itself, or (streamed) its copies in the scratch,
        copied back once the step was queued. A step that raises copies nothing back."""
        if not tensors or self._where.get(id(p)) != "streamed":
            yield tensors
            return
        n = p.numel()
        flat = self._scratch_on(p.device)
        views = [flat[k * n:(k + 1) * n].view(p.shape) for k in range(len(tensors))]
        for view, t in zip(views, tensors):
            view.copy_(t, non_blocking=True)
        yield views
        for view, t in zip(views, tensors):
            t.copy_(view, non_blocking=True)

    def _scratch_on(self, device):
        numel = self._books[device][2] // 4
        flat = self._scratch.get(device)
        if flat is None or flat.numel() < numel:  # a group added later may hold a larger state
            flat = self._scratch[device] = torch.empty(numel, dtype=torch.float32, device=device)
        if device.type == "cuda":  # the kernel reaches it by address on whichever stream is current
            flat.record_stream(torch.cuda.current_stream(device))
        return flat

    def synchronize(self):
        """Waits for queued steps that write host memory (mapped kernels, streamed copies back)
        before the host reads or frees it."""
        for dev in {dev for dev in self._books if dev.type == "cuda"}:
            torch.cuda.synchronize(dev)

    # --- what they take ---
    def device_bytes(self, states):
        """Bytes of state tensors in device memory, the streamed scratch included."""
        return sum(t.numel() * t.element_size() for p, t in states if self._where.get(id(p)) == "device") + \
            sum(t.numel() * t.element_size() for t in self._scratch.values())

    def host_bytes(self, states):
        return sum(t.numel() * t.element_size() for p, t in states if self._where.get(id(p)) != "device")
