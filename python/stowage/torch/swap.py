"""Swap-attention from PyTorch: the tensors that chosen modules (attention, by default) save for
backward go to host memory right after they are saved, and come back before backward needs them,
`prefetch` modules ahead (docs/pytorch.md, "Swap-attention").

On CUDA the copies run on two side streams of their own, into pinned host memory, ordered by
events: device-to-host after the tensor is produced (the device tensor is kept alive for that
stream by record_stream, so its memory is reused only after the copy), host-to-device issued when
backward reaches a swapped module for the `prefetch` modules before it, and the compute stream
waits on the copy's event before it reads. On the CPU the same bookkeeping runs with plain copies
into stowage's own memory (an emulated device's, which PyTorch's allocator does not own), so the
bytes PyTorch holds at the forward/backward boundary drop as they would on a GPU: it is how the
mechanism is tested without one.

    handle = swap_activations(model, prefetch=1)   # model unchanged otherwise
    ... training loop ...
    handle.stats                                   # bytes moved, prefetch hits
    handle.remove()
"""
import collections
import threading
import time
import weakref

import torch

from .. import dlpack as stowage_memory
from .. import memory
from ..errors import InvalidArgumentError
from ._pinned import Holds, pinned_empty
from ._wrapping import WrapHandle, set_forward, storage_of

__all__ = ["swap_activations", "SwapHandle", "SwapStats"]


def _is_attention(module):
    return type(module).__name__.endswith("Attention")


class SwapStats:
    """bytes_to_host / bytes_to_device: moved since creation or reset(); swapped: tensors sent to host;
    prefetched: unpacks whose copy back had been issued ahead (by the prefetch of a later module);
    on_demand: unpacks that had to start their copy then.

    How much of the copying compute hid, named as the C++ SwapScheduler's stats: d2h_ms / h2d_ms,
    the copies' own time (on CUDA timed by events on the copy streams); compute_wait_ms, the time
    compute waited for them (on CUDA from the moment the compute stream reached a swapped tensor
    to the end of its copy back); overlap_fraction = 1 - compute_wait / (d2h + h2d time), 1 with
    no copies. On the CPU the copies run inline, so compute waits for all of them (0). Reading
    these waits for the copies timed so far."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.bytes_to_host = self.bytes_to_device = 0
        self.swapped = self.prefetched = self.on_demand = 0
        self._ms = {"d2h": 0.0, "h2d": 0.0, "wait": 0.0}
        # CUDA event pairs not read yet, oldest first: ("d2h" | "h2d" | "wait", start, end). Pack
        # hooks (forward's thread) and unpack hooks (autograd's) both add to it.
        self._timed = collections.deque()
        self._lock = threading.Lock()

    def _inline(self, kind, seconds):
        """A copy on the compute thread itself: all of it is waited for."""
        self._ms[kind] += 1e3 * seconds
        self._ms["wait"] += 1e3 * seconds

    def _time(self, kind, start, end):
        """Times a copy (or a wait) by two CUDA events. The pairs already done are read at once,
        without waiting: a run that never reads its stats keeps only the copies still in flight."""
        with self._lock:
            self._timed.append((kind, start, end))
            while self._timed and self._timed[0][1].query() and self._timed[0][2].query():
                self._fold(*self._timed.popleft())

    def _fold(self, kind, start, end):
        # A copy back that ended before compute got there cost no wait.
        self._ms[kind] += max(0.0, start.elapsed_time(end))

    def _read_events(self):
        with self._lock:
            while self._timed:
                kind, start, end = self._timed.popleft()
                start.synchronize()
                end.synchronize()
                self._fold(kind, start, end)

    @property
    def d2h_ms(self):
        self._read_events()
        return self._ms["d2h"]

    @property
    def h2d_ms(self):
        self._read_events()
        return self._ms["h2d"]

    @property
    def compute_wait_ms(self):
        self._read_events()
        return self._ms["wait"]

    @property
    def overlap_fraction(self):
        copy = self.d2h_ms + self.h2d_ms
        return max(0.0, 1.0 - self.compute_wait_ms / copy) if copy > 0 else 1.0

    def __repr__(self):
        return (f"SwapStats(bytes_to_host={self.bytes_to_host}, bytes_to_device={self.bytes_to_device}, "
                f"swapped={self.swapped}, prefetched={self.prefetched}, on_demand={self.on_demand}, "
                f"d2h_ms={self.d2h_ms:.3f}, h2d_ms={self.h2d_ms:.3f}, compute_wait_ms={self.compute_wait_ms:.3f}, "
                f"overlap_fraction={self.overlap_fraction:.3f})")


def _span(t):
    """Elements of t's storage from its first element to its last: numel for a non-overlapping and
    dense tensor (contiguous, or permuted as k.transpose(-1, -2)), fewer for an expanded one
    (stride 0), more for one with gaps (a slice, a chunk of a fused qkv)."""
    return 0 if t.numel() == 0 else 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def _layout(t):
    """The strides t comes back with, and so what is copied. Without gaps (span <= numel): its own,
    and its span is copied as it lies, so it comes back as it was saved (a transposed kᵀ stays
    transposed: another layout would send bf16 matmuls down another path, which rounds
    differently). With gaps: dense strides in t's own order of dimensions, as
    clone(memory_format=torch.preserve_format) makes them, so numel elements move, not the gaps
    (q, k and v of a fused qkv would each copy nearly all of it); kernels see the same order of
    dimensions, only a matmul's leading dimension changes, which its arithmetic does not read."""
    if _span(t) <= t.numel():
        return tuple(t.stride())
    strides, step = [0] * t.dim(), 1
    for d in sorted(range(t.dim() - 1, -1, -1), key=t.stride):  # innermost first; ties: the later dimension
        strides[d] = step
        step *= t.shape[d]
    return tuple(strides)


# Byte alignment that the tensor coming back keeps from the saved one: kernels pick vectorized
# paths (and CUDA reductions their order of summation) by the data pointer's alignment.
_ALIGN = 64


class _Packed:
    """One saved tensor in host memory (`host`: its bytes in `stride`'s order, flat), its layout,
    and its way back."""
    __slots__ = ("host", "device", "shape", "stride", "lead", "ready", "back", "back_ready", "call", "__weakref__")

    def __init__(self, host, t, stride, ready, call):
        self.host, self.device, self.ready, self.call = host, t.device, ready, call
        self.shape, self.stride = t.shape, stride
        self.lead = t.data_ptr() % _ALIGN // t.element_size()
        self.back = self.back_ready = None

    def empty_back(self):
        """Where the copy back goes (the host's elements, `lead` elements in) and the tensor it
        becomes: the saved tensor's shape, `stride`, at the saved data pointer's alignment.
        Autograd's formulas do not read the storage offset (lead here, not the saved tensor's)."""
        flat = torch.empty(self.lead + self.host.numel(), dtype=self.host.dtype, device=self.device)
        return flat[self.lead:], flat.as_strided(self.shape, self.stride, self.lead)


class _Copier:
    """Where the copies run: side streams and pinned memory on CUDA, plain copies elsewhere; each
    copy, and each wait for one, timed into `stats`."""

    def __init__(self, stats):
        self.streams = {}
        self.stats = stats
        self.holds = Holds()

    def _pair(self, device):
        if device not in self.streams:
            self.streams[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device))
        return self.streams[device]

    def to_host(self, t):
        """t's elements in host memory, flat in the order of _layout(t)'s strides; those strides;
        and the event of the copy (None: done)."""
        t = t.detach()
        stride = _layout(t)
        own = stride == tuple(t.stride())
        size = _span(t) if own else t.numel()
        if t.device.type != "cuda":
            start = time.perf_counter()
            host = self._host_empty(size, t.dtype)
            if own:
                host.copy_(t.as_strided((size,), (1,)))  # the span as it lies (stride 0 cannot be written to)
            else:
                host.as_strided(t.shape, stride).copy_(t)
            self.stats._inline("d2h", time.perf_counter() - start)
            return host, stride, None
        d2h, _ = self._pair(t.device)
        host = pinned_empty((size,), t.dtype, t.device)
        d2h.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(d2h):
            start, ready = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(d2h)
            # One flat copy over the link: with gaps, the elements are first gathered on the device
            # (on this stream, whose order then guards the scratch's reuse).
            dense = t if own else torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)
            host.copy_(dense.as_strided((size,), (1,)), non_blocking=True)
            ready.record(d2h)
        self.stats._time("d2h", start, ready)
        t.record_stream(d2h)  # its memory is reused only after the copy read it
        self.holds.hold(ready, host)  # and the host buffer only after the copy wrote it
        return host, stride, ready

    @staticmethod
    def _host_empty(size, dtype):
        if memory.using_cuda():
            # stowage's memory is a GPU's here, which CPU tensors cannot use: plain CPU memory keeps
            # the numbers and the bookkeeping (PyTorch's CPU bytes then do not drop).
            return torch.empty(size, dtype=dtype)
        # Bytes viewed as the dtype, as _pinned.pool_tensor does: any dtype (bool, complex, float8),
        # whatever DLPack types this PyTorch reads.
        itemsize = torch.empty((), dtype=dtype).element_size()
        return torch.from_dlpack(stowage_memory.empty((size * itemsize,), torch.uint8)).view(dtype)

    def to_device(self, p):
        """The saved tensor again (same shape and strides), and the event of its copy back (None: done)."""
        if p.device.type != "cuda":
            start = time.perf_counter()
            into, back = p.empty_back()
            into.copy_(p.host)
            self.stats._inline("h2d", time.perf_counter() - start)
            return back, None
        _, h2d = self._pair(p.device)
        with torch.cuda.stream(h2d):
            h2d.wait_event(p.ready)
            start, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(h2d)
            into, back = p.empty_back()
            into.copy_(p.host, non_blocking=True)
            done.record(h2d)
        self.stats._time("h2d", start, done)
        self.holds.hold(done, p.host)
        return back, done

    def use(self, p):
        if p.back_ready is not None:
            current = torch.cuda.current_stream(p.device)
            arrive = torch.cuda.Event(enable_timing=True)
            arrive.record(current)  # compute got here; it goes on when the copy back has ended
            current.wait_event(p.back_ready)
            self.stats._time("wait", arrive, p.back_ready)
            p.back.record_stream(current)
        return p.back


class SwapHandle(WrapHandle):
    """What swap_activations() returns: .stats (SwapStats), .modules (the swapped modules' names),
    .remove() (the model as it was). Also a context manager."""


def swap_activations(model, prefetch=1, modules=None, names=(), min_bytes=0):
    """Swaps what the chosen modules save for backward to host memory. modules: a predicate on a
    module (default: classes named *Attention), or `names` (qualified module names). prefetch:
    how many swapped module calls before the current one are brought back when backward reaches
    it (0: each comes back only when it is read). Tensors under min_bytes and parameters stay.

    A tensor comes back with the shape and strides it was saved with (a transposed k saved by a
    matmul stays transposed: another layout could round differently in bf16), at its data
    pointer's alignment; one with gaps (a chunk of a fused qkv) comes back dense in its own order
    of dimensions, and the gaps are not copied (_layout). A deep copy or a pickle of the model is a
    plain model (stowage.torch._wrapping)."""
    if not isinstance(prefetch, int) or prefetch < 0:
        raise InvalidArgumentError(f"swap_activations: prefetch must be an int >= 0 (got {prefetch!r})")
    found = dict(model.named_modules())
    missing = [n for n in names if n not in found]
    if missing:
        raise InvalidArgumentError(f"swap_activations: no module named {', '.join(missing)}")
    pick = modules or _is_attention
    chosen = [n for n, m in found.items() if n in names or (not names and pick(m))]
    if not chosen:
        raise InvalidArgumentError("swap_activations: no module was chosen (no *Attention class; name them)")
    # A chosen module inside another (Hugging Face's BertSelfAttention in BertAttention) would count
    # as a call of its own between its parent's, and backward's prefetch, which counts calls back
    # from the one it reaches, would bring back the wrong ones. The outermost is swapped whole.
    def within(n, outer):
        return n != outer and (outer == "" or n.startswith(outer + "."))  # "" is the model itself

    inner = [n for n in chosen if any(within(n, outer) for outer in chosen)]
    if names and inner:
        outer = next(o for o in chosen if within(inner[0], o))
        raise InvalidArgumentError(f"swap_activations: '{inner[0]}' is inside '{outer}', which is named too; "
                                   "name one of them (the outer one swaps what both save)")
    chosen = [n for n in chosen if n not in inner]
    # A parameter's storage, not the tensor: linear layers save views of their weights (weight.t()).
    # Taken again at every forward of the model: an optimizer made after this call may have given
    # the parameters new storage (a bf16 copy, shared-storage planes), and the old addresses may
    # then hold activations.
    params = {storage_of(p).data_ptr() for p in model.parameters()}
    stats, undo = SwapStats(), []
    copier = _Copier(stats)
    # Each forward of the model gets its own list of its swapped module calls, in order, each a list
    # of weak references to its _Packed (autograd owns them, so a saved tensor's copies go when its
    # backward node lets it go). Two forwards before one backward keep apart.
    forward_calls = [[]]

    def prefetch_before(calls, call):
        for earlier in calls[max(0, call - prefetch):call]:
            for ref in earlier:
                p = ref()
                if p is not None and p.back is None:
                    p.back, p.back_ready = copier.to_device(p)
                    stats.bytes_to_device += p.host.numel() * p.host.element_size()

    def make_hooks(calls, call):
        def pack(t):
            if storage_of(t).data_ptr() in params or t.numel() * t.element_size() < min_bytes:
                return t
            host, stride, ready = copier.to_host(t)
            p = _Packed(host, t, stride, ready, call)
            calls[call].append(weakref.ref(p))
            stats.swapped += 1
            stats.bytes_to_host += host.numel() * host.element_size()
            return p

        def unpack(p):
            if not isinstance(p, _Packed):
                return p
            if p.back is None:
                p.back, p.back_ready = copier.to_device(p)
                stats.bytes_to_device += p.host.numel() * p.host.element_size()
                stats.on_demand += 1
            else:
                stats.prefetched += 1
            if prefetch:
                prefetch_before(calls, p.call)
            return copier.use(p)
        return pack, unpack

    for name in chosen:
        module = found[name]
        original = module.forward

        def forward(*args, __original=original, **kwargs):
            if not torch.is_grad_enabled():
                return __original(*args, **kwargs)
            calls = forward_calls[0]
            calls.append([])
            with torch.autograd.graph.saved_tensors_hooks(*make_hooks(calls, len(calls) - 1)):
                return __original(*args, **kwargs)

        set_forward(module, forward, undo)
    # Each forward of the model starts its own list of calls and takes the parameters' storages
    # again. A wrapper, as the modules' (not a forward pre-hook): a deep copy or a pickle of the
    # model drops it with theirs (_wrapping).
    model_forward = model.forward

    def new_forward(*args, **kwargs):
        forward_calls[0] = []
        params.clear()
        params.update(storage_of(p).data_ptr() for p in model.parameters())
        return model_forward(*args, **kwargs)

    set_forward(model, new_forward, undo)
    return SwapHandle(stats, chosen, undo)
