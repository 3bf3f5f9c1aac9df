"""Swap-attention from PyTorch: the tensors that chosen modules (attention, by default) save for
backward go to host memory right after they are saved, and come back before backward needs them,
`prefetch` modules ahead (docs/pytorch.md, "Swap-attention"). Within one module call each byte of a
storage moves once each way, however many saved tensors view it, and comes back as one device copy.

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
import contextlib
import threading
import time
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .. import dlpack as stowage_memory
from .. import memory
from ..errors import InvalidArgumentError
from ._pinned import Holds, pinned_empty
from ._wrapping import WrapHandle, check_names, every_name, set_forward, storage_of, wrapped_as

__all__ = ["swap_activations", "SwapHandle", "SwapStats"]


def _is_attention(module):
    return type(module).__name__.endswith("Attention")


class SwapStats:
    """bytes_to_host / bytes_to_device: moved since creation or reset(), each byte of a storage once
    per module call however many of its saved tensors cover it; swapped: saved tensors kept in host
    memory (those sharing another's copy included); prefetched: unpacks whose copy back had been
    issued ahead (by the prefetch of a later module); on_demand: unpacks whose copy back was started
    by their own module call's backward (by that unpack, or an earlier one sharing its copy).

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
        self._ms = {"d2h": 0.0, "h2d": 0.0, "wait": 0.0, "hook": 0.0}
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
    def hook_ms(self):
        """Host time inside the saved-tensor hooks (forward's packs and backward's unpacks): on CUDA
        their bookkeeping and issuing the copies; on the CPU, where the copies run inline, those too.
        The swapped modules' wrappers' own work is not in it."""
        return self._ms["hook"]

    def _hook(self, seconds):
        with self._lock:
            self._ms["hook"] += 1e3 * seconds

    @property
    def overlap_fraction(self):
        copy = self.d2h_ms + self.h2d_ms
        return max(0.0, 1.0 - self.compute_wait_ms / copy) if copy > 0 else 1.0

    def __repr__(self):
        return (f"SwapStats(bytes_to_host={self.bytes_to_host}, bytes_to_device={self.bytes_to_device}, "
                f"swapped={self.swapped}, prefetched={self.prefetched}, on_demand={self.on_demand}, "
                f"d2h_ms={self.d2h_ms:.3f}, h2d_ms={self.h2d_ms:.3f}, compute_wait_ms={self.compute_wait_ms:.3f}, "
                f"overlap_fraction={self.overlap_fraction:.3f}, hook_ms={self.hook_ms:.3f})")


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


class _Dense:
    """A saved tensor copied on its own (one with gaps, an empty one, a conjugate or negative view):
    its elements in host memory (`host`, flat in `stride`'s order), its layout, and its way back.
    What autograd holds for it: each tensor saved as the same view shares it."""
    __slots__ = ("host", "device", "shape", "stride", "lead", "ready", "call", "back", "back_ready", "prefetched",
                 "__weakref__")

    def __init__(self, host, t, stride, ready, call):
        self.host, self.device, self.ready, self.call = host, t.device, ready, call
        self.shape, self.stride = t.shape, stride
        self.lead = t.data_ptr() % _ALIGN // t.element_size()
        self.back = self.back_ready = None
        self.prefetched = False

    @property
    def nbytes(self):
        return self.host.numel() * self.host.element_size()

    def empty_back(self):
        """Where the copy back goes (the host's elements, `lead` elements in) and the tensor it
        becomes: the saved tensor's shape, `stride`, at the saved data pointer's alignment.
        Autograd's formulas do not read the storage offset (lead here, not the saved tensor's)."""
        flat = torch.empty(self.lead + self.host.numel(), dtype=self.host.dtype, device=self.device)
        return flat[self.lead:], flat.as_strided(self.shape, self.stride, self.lead)


class _Store:
    """The bytes of one device storage that a module call saved: `pieces`, disjoint byte ranges from
    the storage's start ([start, end, host, ready], sorted), each copied once however many saved
    tensors cover it. Backward brings each run of adjacent pieces back into one device buffer
    (`back`: [start, end, flat, lead]) at the storage's alignment, and every saved tensor in it is
    a view of that buffer with its own offset, shape and strides."""
    __slots__ = ("device", "address", "pieces", "call", "back", "back_ready", "prefetched", "__weakref__")

    def __init__(self, t, call):
        self.device, self.address, self.call = t.device, storage_of(t).data_ptr(), call
        self.pieces = []
        self.back = self.back_ready = None
        self.prefetched = False

    @property
    def nbytes(self):
        return sum(end - start for start, end, _, _ in self.pieces)

    def missing(self, lo, hi):
        """The parts of [lo, hi) that no piece holds yet."""
        gaps = []
        for start, end, _, _ in self.pieces:
            if end <= lo:
                continue
            if start >= hi:
                break
            if start > lo:
                gaps.append((lo, start))
            lo = max(lo, end)
        if lo < hi:
            gaps.append((lo, hi))
        return gaps

    def add(self, start, end, host, ready):
        self.pieces.append([start, end, host, ready])
        self.pieces.sort(key=lambda piece: piece[0])

    def runs(self):
        """The pieces grouped into runs of adjacent ones: one device buffer each."""
        runs = []
        for piece in self.pieces:
            if runs and runs[-1][-1][1] == piece[0]:
                runs[-1].append(piece)
            else:
                runs.append([piece])
        return runs

    def view(self, offset, nbytes, shape, stride, dtype):
        """A saved tensor (`nbytes` of its span from byte `offset` of the storage) over the buffer
        that holds it, at the same alignment as the saved one."""
        for start, end, flat, lead in self.back:
            if start <= offset and offset + nbytes <= end:
                at = lead + offset - start
                return flat[at:at + nbytes].view(dtype).as_strided(shape, stride)
        raise AssertionError("swap: a saved tensor outside its storage's copied bytes")


class _Saved:
    """What autograd holds for a tensor swapped as part of a _Store: where it lies in the storage."""
    __slots__ = ("store", "offset", "nbytes", "shape", "stride", "dtype")

    def __init__(self, store, offset, t):
        self.store, self.offset, self.nbytes = store, offset, _span(t) * t.element_size()
        self.shape, self.stride, self.dtype = t.shape, tuple(t.stride()), t.dtype


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
        self.holds.prune()
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

    def bytes_to_host(self, raw):
        """A host copy of raw (bytes of a device storage, a flat uint8 view) and the event of the
        copy (None: done)."""
        if raw.device.type != "cuda":
            start = time.perf_counter()
            host = self._host_empty(raw.numel(), torch.uint8)
            host.copy_(raw)
            self.stats._inline("d2h", time.perf_counter() - start)
            return host, None
        d2h, _ = self._pair(raw.device)
        self.holds.prune()
        host = pinned_empty((raw.numel(),), torch.uint8, raw.device)
        d2h.wait_stream(torch.cuda.current_stream(raw.device))
        with torch.cuda.stream(d2h):
            start, ready = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(d2h)
            host.copy_(raw, non_blocking=True)
            ready.record(d2h)
        self.stats._time("d2h", start, ready)
        raw.record_stream(d2h)  # the storage's memory is reused only after the copy read it
        self.holds.hold(ready, host)
        return host, ready

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

    def to_device(self, c):
        """Sets c.back (a _Dense: the saved tensor again, same shape and strides; a _Store: a device
        buffer for each run of its pieces) and c.back_ready (the event of the copy back; None: done)."""
        cuda = c.device.type == "cuda"
        if cuda:
            _, h2d = self._pair(c.device)
            context = torch.cuda.stream(h2d)
        else:
            context, begun = contextlib.nullcontext(), time.perf_counter()
        with context:
            if cuda:
                for ready in ([c.ready] if isinstance(c, _Dense) else [piece[3] for piece in c.pieces]):
                    h2d.wait_event(ready)  # a copy back never races the copy out that fills its buffer
                start, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(h2d)
            if isinstance(c, _Dense):
                into, back = c.empty_back()
                into.copy_(c.host, non_blocking=cuda)
                hosts = [c.host]
            else:
                back, hosts = [], []
                for run in c.runs():
                    first, last = run[0][0], run[-1][1]
                    lead = (c.address + first) % _ALIGN
                    flat = torch.empty(lead + last - first, dtype=torch.uint8, device=c.device)
                    for start_byte, end_byte, host, _ in run:
                        flat[lead + start_byte - first:lead + end_byte - first].copy_(host, non_blocking=cuda)
                        hosts.append(host)
                    back.append((first, last, flat, lead))
            if cuda:
                done.record(h2d)
        if cuda:
            self.stats._time("h2d", start, done)
            for host in hosts:
                self.holds.hold(done, host)
        else:
            self.stats._inline("h2d", time.perf_counter() - begun)
            done = None
        c.back, c.back_ready = back, done

    def use(self, c, t):
        """t (c's copy back, or a view of it) once the copy back has landed."""
        if c.back_ready is not None:
            current = torch.cuda.current_stream(c.device)
            arrive = torch.cuda.Event(enable_timing=True)
            arrive.record(current)  # compute got here; it goes on when the copy back has ended
            current.wait_event(c.back_ready)
            self.stats._time("wait", arrive, c.back_ready)
            t.record_stream(current)
        return t


class _Pass:
    """One forward's swapped module calls, in order: call `base + i` is calls[i], a list of weak
    references to its copies (_Store, _Dense; autograd owns them through what it saved, so they go
    when backward lets them go). Finished calls with no copy left are dropped from the front:
    prefetch has nothing to bring back from them, and a loop that never calls the model (so never
    starts a new pass) keeps only the calls still running or waiting for backward."""

    def __init__(self):
        self.calls = collections.deque()
        self.base = 0
        self.running = set()  # calls whose forward has not returned (one chosen module may call another)

    def prune(self):
        while self.calls and self.base not in self.running and all(ref() is None for ref in self.calls[0]):
            self.calls.popleft()
            self.base += 1

    def add(self):
        self.calls.append([])
        return self.base + len(self.calls) - 1

    def get(self, call):
        return self.calls[call - self.base] if call >= self.base else ()


_ROLE = "swapped module"  # the role of a swapped module's wrapper (_wrapping.wrapped_as)
_SWAPPED = weakref.WeakSet()  # every module a handle wrapped; wrapped_as() says which still are


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
    of dimensions, and the gaps are not copied (_layout), unless the call's earlier saves already
    copied every byte of its span. One module call copies the bytes of a storage once however many
    of its saves cover them (x saved by separate q, k and v projections; softmax's output and the
    matmul's view of it), and they come back as one device copy that each is a view of (_Store).
    A module that an earlier handle (not removed) swaps already, or one inside or around such a
    module, is refused. A deep copy or a
    pickle of the model is a plain model (stowage.torch._wrapping)."""
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise InvalidArgumentError(f"swap_activations: prefetch must be an int >= 0 (got {prefetch!r})")
    names = check_names("swap_activations", "names", names)
    found = dict(model.named_modules())
    every = dict(every_name(model))  # a module used at several places answers to each of its names
    missing = [n for n in names if n not in every]
    if missing:
        raise InvalidArgumentError(f"swap_activations: no module named {', '.join(missing)}")
    pick = modules or _is_attention
    named = {id(every[n]) for n in names}
    chosen = [n for n, m in found.items() if id(m) in named or (not names and pick(m))]
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
    # A module an earlier handle swaps, or one inside or around it: the two handles' saved-tensor
    # hooks would nest and only the innermost pair packs, so one handle would swap and count nothing.
    # Every swapped module is seen, also one above the model given (a module has no parent link).
    name_of = {id(m): n for n, m in found.items()}
    swapped = [m for m in list(_SWAPPED) if wrapped_as(m, _ROLE)]
    below = {id(s): {id(m) for m in s.modules()} for s in swapped}
    # In the model's order, so the message names the first of them.
    again = [(n, found[n], s) for n in chosen for s in swapped
             if id(found[n]) in below[id(s)] or any(m is s for m in found[n].modules())]
    if again:
        n, c, s = again[0]
        label = n or "the module given"
        if c is s:
            where = f"{label} is"
        elif id(s) in name_of:
            where = (f"{label} is {'inside' if id(c) in below[id(s)] else 'around'} "
                     f"{name_of[id(s)] or 'the module given'}, which is")
        else:
            where = f"{label} is inside a {type(s).__name__} above {'it' if not n else 'the module given'}, which is"
        raise InvalidArgumentError(f"swap_activations: {where} already swapped by an earlier handle "
                                   "(swap_activations() or apply(swap=True)) that was not removed; remove() that "
                                   "handle first")
    # A parameter's storage, not the tensor: linear layers save views of their weights (weight.t()).
    # An optimizer made after this call may give the parameters new storage (a bf16 copy, apply()'s
    # shared-storage planes), and the old addresses may then hold activations: the model's are
    # taken again at the start of each forward (whether the loop calls the model or only its
    # submodules), and each swapped module's own at each of its calls.
    params = {storage_of(p).data_ptr() for p in model.parameters()}
    stats, undo = SwapStats(), []
    copier = _Copier(stats)
    # The current forward's calls (a _Pass). Each forward of the model starts its own, so two
    # forwards before one backward keep apart; a loop that calls only submodules goes on in one.
    current = [_Pass()]
    in_model = [0]  # the model's forwards running: a call inside one is part of the pass it started

    def take_params():
        params.clear()
        params.update(storage_of(p).data_ptr() for p in model.parameters())

    def bring_back(c, prefetched):
        copier.to_device(c)
        c.prefetched = prefetched
        stats.bytes_to_device += c.nbytes

    def prefetch_before(run, call):
        for earlier in range(max(run.base, call - prefetch), call):
            for ref in run.get(earlier):
                c = ref()
                if c is not None and c.back is None:
                    bring_back(c, True)

    def make_hooks(run, call, own):
        # This call's storages so far: (storage, its address, version) -> (a weak reference that
        # keeps the key's storage from being taken for another's while this call runs, _Store);
        # the version keeps bytes changed in place between two saves apart. And its views with
        # gaps copied on their own: (storage key, offset, shape, strides, dtype) -> _Dense.
        stores, views = {}, {}

        def keep(c):
            run.get(call).append(weakref.ref(c))
            return c

        def dense(t):
            host, stride, ready = copier.to_host(t)
            c = keep(_Dense(host, t, stride, ready, call))
            stats.bytes_to_host += c.nbytes
            return c

        def pack(t):
            storage = storage_of(t)
            ptr = storage.data_ptr()
            if ptr in params or ptr in own or t.numel() * t.element_size() < min_bytes:
                return t
            stats.swapped += 1
            if t.numel() == 0 or t.is_conj() or t.is_neg():
                return dense(t)  # no bytes to share, or bytes that are not its values
            ref = StorageWeakRef(storage)
            key = (ref.cdata, ptr, t._version)
            if key not in stores:
                stores[key] = (ref, keep(_Store(t, call)))
            store = stores[key][1]
            t = t.detach()
            span, size = _span(t), t.element_size()
            lo, hi = t.storage_offset() * size, (t.storage_offset() + span) * size
            if span <= t.numel():  # without gaps: its bytes as they lie, those not copied yet
                raw = t.as_strided((span,), (1,)).view(torch.uint8)
                for a, b in store.missing(lo, hi):
                    host, ready = copier.bytes_to_host(raw[a - lo:b - lo])
                    store.add(a, b, host, ready)
                    stats.bytes_to_host += b - a
                return _Saved(store, lo, t)
            if not store.missing(lo, hi):
                return _Saved(store, lo, t)  # its bytes, gaps included, are copied already
            # With gaps: its own elements, dense (_layout), once for each distinct view.
            view = (key, lo, tuple(t.shape), tuple(t.stride()), t.dtype)
            if view not in views:
                views[view] = dense(t)
            return views[view]

        def unpack(p):
            if isinstance(p, _Saved):
                c = p.store
            elif isinstance(p, _Dense):
                c = p
            else:
                return p
            if c.back is None:
                bring_back(c, False)
            if c.prefetched:
                stats.prefetched += 1
            else:
                stats.on_demand += 1
            if prefetch:
                prefetch_before(run, c.call)
            if c is p:
                return copier.use(c, c.back)
            return copier.use(c, c.view(p.offset, p.nbytes, p.shape, p.stride, p.dtype))
        def timed(hook):
            def run_hook(x):
                start = time.perf_counter()
                try:
                    return hook(x)
                finally:
                    stats._hook(time.perf_counter() - start)
            return run_hook

        return timed(pack), timed(unpack), (stores, views)

    for name in chosen:
        module = found[name]
        original = module.forward

        def forward(*args, __original=original, __module=module, **kwargs):
            if not torch.is_grad_enabled():
                return __original(*args, **kwargs)
            run = current[0]
            run.prune()
            if not run.calls and not in_model[0]:
                # The previous forward's backward has let every copy go: a new forward, of the
                # submodules (one of the model takes the parameters' storages itself).
                take_params()
            own = {storage_of(p).data_ptr() for p in __module.parameters()}
            call = run.add()
            pack, unpack, seen = make_hooks(run, call, own)
            run.running.add(call)
            try:
                with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                    return __original(*args, **kwargs)
            finally:
                run.running.discard(call)
                for d in seen:
                    d.clear()  # the storages' weak references; autograd owns the copies it saved

        set_forward(module, forward, undo, role=_ROLE)
        _SWAPPED.add(module)
    # Each forward of the model starts its own pass and takes the parameters' storages again. A
    # wrapper, as the modules' (not a forward pre-hook): a deep copy or a pickle of the model drops
    # it with theirs (_wrapping).
    model_forward = model.forward

    def new_forward(*args, **kwargs):
        current[0] = _Pass()
        take_params()
        in_model[0] += 1
        try:
            return model_forward(*args, **kwargs)
        finally:
            in_model[0] -= 1

    set_forward(model, new_forward, undo)
    return SwapHandle(stats, chosen, undo)
