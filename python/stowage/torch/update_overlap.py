"""The shared-storage optimizers' update overlapped with the next forward (overlap_update=True of
SharedStorageAdamW / SharedStorageSGD and apply(); docs/pytorch_optimizers.md, "Overlapping the update").

step() queues the fused update of CUDA parameters on a side stream of their device, in CHUNKS
chunks of about equal size that follow the order of the attached model's parameters, and records
an event after each chunk's last kernel (one per param group). It waits for none of them. A
forward pre-hook on every module that holds parameters makes the stream running the module wait
for the chunk holding the last of them; a side stream runs in order, so chunk k's event means
chunks 0..k are written (a chunk with nothing to update this step has no event: the one before it
stands for it). The first layers compute as soon as their weights are, while the update of the
later ones (bound by the host link when the state is offloaded, state_offload="mapped") goes on
beside them. A module whose own forward reads its children's parameters without calling them
waits for its whole subtree: torch.nn.MultiheadAttention (its out_proj) and the Transformer
layers (their inference fast path) are known; for any other, call opt.wait_for_update() first.

The clipping coefficient and the non-finite check are decided before anything is queued, as
without overlap: the numbers are the same. The update reads the gradients on the side stream, so
each is recorded there (record_stream): one dropped meanwhile (zero_grad()) is not handed out to
other work before the update has read it.

Needs the model (opt.attach(model); apply() attaches) with every stepped parameter in it, and an
allocator that honours record_stream (PyTorch's, or stowage's through the shim): refused at
step() otherwise. The optimizer's own methods wait for the update by themselves (zero_grad with
set_to_none=False waits for all of it, since it writes the gradients); any other read of the
weights after step() outside a module's forward (an EMA, model.state_dict() for a checkpoint),
and zeroing gradients in place elsewhere (model.zero_grad(set_to_none=False), p.grad.zero_()),
calls opt.wait_for_update() first. A forward on another stream than the device's current one
must be ordered after it (stream.wait_stream(current), as for any side stream). Parameters whose
state is streamed step on the current stream, as without overlap; CPU parameters step on the host
at once (their chunks are still separate calls).
"""
import weakref

import torch

# The first forward waits for 1/CHUNKS of the update; each chunk is one more kernel launch and
# event per device and param group.
CHUNKS = 8

# Modules whose own forward reads their children's parameters without calling the children.
READ_SUBTREE = (torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer)


def _register_first(module, hook):
    """The hook, before the module's other forward pre-hooks (one that computes a weight from
    parameters, as the old weight_norm does, reads them): prepend= exists from PyTorch 2.0."""
    try:
        return module.register_forward_pre_hook(hook, prepend=True)
    except TypeError:
        return module.register_forward_pre_hook(hook)


def _read_by(module):
    """The parameters a module's own forward reads."""
    return module.parameters(recurse=isinstance(module, READ_SUBTREE))


class UpdateOverlap:
    """The chunks, hooks, side streams and events of one optimizer. `ours(p)`: whether p is one of
    the optimizer's parameters."""

    def __init__(self, ours):
        self._ours = ours
        self._models = []  # weak references to the attached models, in the order attached
        self._chunk = None  # id(param) -> chunk, from the models' order; None: to be made again
        self._needs = weakref.WeakKeyDictionary()  # module -> {device: the chunk its forward waits for}
        self._handles = weakref.WeakKeyDictionary()  # module -> its hook's handle
        self._streams = {}  # device -> side stream
        self._events = {}  # device -> [(chunk, event)] of the last update queued there, in order
        self._waited = {}  # (device, stream) -> the chunk up to which that stream waited for every kernel
        self._pending = False  # some device's current stream has not waited for all of its update

    # --- the model ---
    def attach(self, model):
        """Hooks the modules of `model` whose forward reads the optimizer's parameters (again: the
        ones new). The chunks are made again, so a queued update is waited for first: its events
        are numbered the old way."""
        self.join()
        if not any(ref() is model for ref in self._models):
            self._models.append(weakref.ref(model))
        self._chunk = None
        for module in model.modules():
            if module not in self._handles and any(self._ours(p) for p in _read_by(module)):
                self._handles[module] = _register_first(module, self._before_forward)

    def changed(self):
        """The optimizer's parameters changed (a param group added): the chunks are made again."""
        self.join()
        self._chunk = None

    def detach(self):
        for handle in list(self._handles.values()):
            handle.remove()
        self._handles = weakref.WeakKeyDictionary()

    def chunk_of(self, p):
        """p's chunk, or None when p is in no attached model."""
        return self._chunks().get(id(p))

    def _chunks(self):
        if self._chunk is None:
            order, seen = [], set()
            for ref in self._models:
                model = ref()
                for p in model.parameters() if model is not None else ():
                    if id(p) not in seen and self._ours(p):
                        seen.add(id(p))
                        order.append(p)
            total = max(1, sum(p.numel() for p in order))
            chunk, before = {}, 0
            for p in order:  # where the parameter starts, in CHUNKS equal parts of all elements
                chunk[id(p)] = min(CHUNKS - 1, before * CHUNKS // total)
                before += p.numel()
            self._chunk = chunk
            self._needs = weakref.WeakKeyDictionary()
        return self._chunk

    # --- the step ---
    def begin(self, devices):
        """Before the step's kernels on these CUDA devices: each side stream waits for what the
        device's current stream has queued (the gradients, the checks), and the last step's events
        give way to this one's (the side stream is in order: they come after those)."""
        for device in devices:
            side = self._streams.get(device)
            if side is None:
                side = self._streams[device] = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            self._events[device] = []
            for key in [key for key in self._waited if key[0] == device]:
                del self._waited[key]

    def placement(self, device):
        """Where a chunk's kernel runs: the device's side stream."""
        return {"device": device.index if device.index is not None else torch.cuda.current_device(),
                "stream": self._streams[device].cuda_stream}

    def queued(self, device, chunk, grads):
        """A chunk's kernel (of one param group) was queued on the side stream: its gradients are
        recorded there, and the event after the chunk's last kernel is what forward waits for."""
        side = self._streams[device]
        for g in grads:
            g.record_stream(side)
        event = torch.cuda.Event()
        event.record(side)
        events = self._events[device]
        if events and events[-1][0] == chunk:  # another group's kernel of the same chunk: this one comes after it
            events[-1] = (chunk, event)
        else:
            events.append((chunk, event))
        self._pending = True

    def _before_forward(self, module, inputs):
        if not self._pending:
            return
        needs = self._needs.get(module)
        if needs is None:
            chunks, needs = self._chunks(), {}
            for p in _read_by(module):
                c = chunks.get(id(p))
                if c is not None and p.device.type == "cuda":
                    needs[p.device] = max(c, needs.get(p.device, -1))
            self._needs[module] = needs
        for device, chunk in needs.items():
            self._wait(device, chunk)

    def _wait(self, device, chunk):
        """The device's current stream waits for chunks 0..`chunk`. `_waited`: the stream has
        waited for every kernel of the chunks up to that one."""
        events = self._events.get(device)
        if not events:
            return
        stream = torch.cuda.current_stream(device)
        key = (device, stream.cuda_stream)
        if self._waited.get(key, -1) >= chunk:
            return
        # The last event at or before the chunk: chunks after it up to this one queued nothing.
        # None: nothing was queued for chunks 0..chunk.
        event = next((e for c, e in reversed(events) if c <= chunk), None)
        if event is not None:
            stream.wait_event(event)
        self._waited[key] = chunk
        self._pending = any(self._waited.get((d, torch.cuda.current_stream(d).cuda_stream), -1) < e[-1][0]
                            for d, e in self._events.items() if e)

    def join(self):
        """Each device's current stream waits for the whole update queued so far."""
        for device, events in self._events.items():
            if events:
                torch.cuda.current_stream(device).wait_event(events[-1][1])
        self._events.clear()
        self._waited.clear()
        self._pending = False

    def synchronize(self):
        """The host waits for every update queued on the side streams."""
        for side in self._streams.values():
            side.synchronize()
