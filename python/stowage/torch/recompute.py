"""Storage-release activation recomputation for PyTorch (MindSpeed's CheckpointWithoutOutput).

The activation runs under no_grad and only its input is saved. Once the next layer has consumed
and saved the output, the output's storage is resized to 0 bytes (the tensor object and every
saved view of it stay); a hook on a later tensor recomputes the activation, puts the bytes back
into the same storage, and keeps the recomputed graph for the activation's own backward.

    act = ReleasedActivation()
    a = act.checkpoint(F.gelu, h)       # h is saved, a is not
    y = fc2(a)                          # fc2 saves a
    act.release()                       # a's bytes go back to the allocator
    act.register_recompute(y)           # a is recomputed before y's backward node runs

or, on an unmodified model, `handle = recompute_activations(model)` ... `handle.remove()`.
Needs only torch (not libstowage). docs/recompute.md, "From PyTorch".
"""
import contextlib
import dataclasses
import threading
import warnings
import weakref

import torch

from ..errors import InvalidArgumentError, StowageError, UnsupportedError
from ._known_activations import known_activation
from ._wrapping import (WrapHandle, callers_level, check_names, every_name, set_forward, storage_of as _storage,
                        wrapped_as)

__all__ = ["ReleasedActivation", "RecomputeStats", "RecomputeHandle", "recompute_activations",
           "DEFAULT_ACTIVATIONS"]

# Their backward saves the input, so the input is saved anyway and dropping the output is a pure
# saving. (ReLU, Tanh, Sigmoid save their output: releasing it would only trade it for the input.)
DEFAULT_ACTIVATIONS = (torch.nn.GELU, torch.nn.SiLU)


_TENSOR = object()  # marks a tensor argument's place among fn's arguments


def _dense(t):
    # Strides are a permutation of a contiguous layout: no gaps, no overlap. An empty tensor holds
    # no bytes, whatever its strides.
    if t.numel() == 0:
        return True
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda p: p[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


@contextlib.contextmanager
def _in_modes(modes):
    then = [(m, m.training) for m, _ in modes]
    for m, training in modes:
        m.training = training
    try:
        yield
    finally:
        for m, training in then:
            m.training = training


def _rng_state(device):
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(device, state):
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


@contextlib.contextmanager
def _replayed_rng(device, state):
    # Replay the forward's generator state, then hand the training loop its own state back.
    mine = _rng_state(device)
    _set_rng_state(device, state)
    try:
        yield
    finally:
        _set_rng_state(device, mine)


def _autocast_state():
    # Autocast is thread-local and off in CUDA's backward threads: replay the forward's (as
    # torch.utils.checkpoint does).
    devices = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    state = []
    for dev in devices:
        if hasattr(torch, "get_autocast_dtype"):  # 2.4+
            state.append((dev, torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev)))
        elif dev == "cpu":
            state.append((dev, torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()))
        else:
            state.append((dev, torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()))
    return state


class RecomputeStats:
    """bytes_released / activations_released: in the last forward of the wrapped model (or since
    reset()); recomputations: activation forwards rerun in backward, since creation (a known
    activation, _known_activations, reruns only to restore released bytes)."""

    def __init__(self):
        self.bytes_released = 0
        self.activations_released = 0
        self.recomputations = 0

    def reset(self):
        self.bytes_released = 0
        self.activations_released = 0

    def __repr__(self):
        return (f"RecomputeStats(bytes_released={self.bytes_released}, "
                f"activations_released={self.activations_released}, recomputations={self.recomputations})")


class _Checkpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, owner, *args):
        out = owner._run_forward(args)
        if any(ctx.needs_input_grad):
            ctx.owner = owner  # ctx -> owner only; owner keeps a weak reference back (no cycle)
            ctx.save_for_backward(*owner._tensor_args(args))
            owner._ctx = weakref.ref(ctx)
        else:
            # No backward node will exist; the inputs are still needed to restore the bytes.
            owner._inputs = owner._tensor_args(args)
        return out

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():
            # create_graph=True: the recomputed graph starts at detached copies of the inputs, so
            # the gradient's own graph would miss every term through them. Refused (the bytes are
            # back already); torch.utils.checkpoint(use_reentrant=True) only warns here.
            raise UnsupportedError("recomputed activation: backward with create_graph=True (a gradient of a "
                                   "gradient: a gradient penalty, a Hessian-vector product) is not supported, its "
                                   "second-order terms would be lost; remove() recomputation for such a loss")
        owner = ctx.owner
        if owner._known is not None:  # no graph: the backward kernels on the saved inputs
            if owner._storage is not None:  # released, and no hook restored it
                owner._recompute()
            kept, owner._kept = owner._kept, None
            grads = owner._known.backward(grad, kept, *ctx.saved_tensors)  # every argument is a tensor
            return (None,) + tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad[1:]))
        if owner._pending is None:  # restored without its graph, never released, or no hook fired
            owner._recompute()
        out, args = owner._pending
        owner._pending = None
        if out.requires_grad:
            # Reentrant, as torch.utils.checkpoint(use_reentrant=True): leaves inside fn accumulate .grad.
            torch.autograd.backward(out, grad)
        return (None,) + tuple(a.grad if isinstance(a, torch.Tensor) and a.requires_grad else None for a in args)


class ReleasedActivation:
    """One activation call whose output can be released after its consumer saved it and is
    recomputed, bit for bit, before the consumer's backward reads it.

    fn must return one tensor, be deterministic given the generator state (dropout is replayed),
    and must not write into its inputs. Used once: one checkpoint() per object."""

    def __init__(self, stats=None):
        self.stats = stats if stats is not None else RecomputeStats()
        self.released_bytes = 0
        self._fn = None
        self._ctx = None        # weakref to the backward node (it holds the saved inputs)
        self._inputs = None     # the inputs, when no backward node exists
        self._output = None     # weakref to the output, until release
        self._storage = None    # the released storage, until restored
        self._pending = None    # (recomputed output, detached args) for the backward node
        self._known = None      # a KnownActivation: restored in place, no graph (_known_activations)
        self._modes = ()        # (module, training) at the forward (remember_modes)
        self._into = None       # for a known one: the released storage, seen by a tensor of its own
        self._kept = None       # for a known one: what its restore left for its backward
        # The hook keeps the recomputed graph for the backward node (one rerun). Off when several
        # activations are restored by the same hook tensor: each would then hold two copies of its
        # output until its own backward node runs; the graph is rebuilt there instead (two reruns).
        self.graph_at_restore = True

    def _tensor_args(self, args):
        return [a for a in args if isinstance(a, torch.Tensor)]

    def _run_forward(self, args):
        tensors = self._tensor_args(args)
        self._device = tensors[0].device if tensors else torch.device("cpu")
        self._autocast = _autocast_state()
        if not any(on for _, on, _ in self._autocast):  # under autocast fn may run in another dtype
            self._known = known_activation(self._fn, args)
        # torch's GeLU and SiLU draw no numbers; a protocol module may (dropout).
        self._rng = _rng_state(self._device) if self._known is None or self._known.replay else None
        self._template = [_TENSOR if isinstance(a, torch.Tensor) else a for a in args]
        self._versions = [t._version for t in tensors]
        out = self._fn(*args)  # autograd.Function.forward runs under no_grad
        if not isinstance(out, torch.Tensor):
            raise InvalidArgumentError(f"ReleasedActivation: fn must return one tensor, not {type(out).__name__}")
        ptr = _storage(out).data_ptr()
        if ptr and any(_storage(t).data_ptr() == ptr for t in tensors):
            raise InvalidArgumentError("ReleasedActivation: fn's output shares storage with its input (an in-place "
                                       "or aliasing fn): the input is what recomputation reads, it cannot be "
                                       "released or overwritten")
        self._is_view = out._base is not None
        return out

    def checkpoint(self, fn, *inputs):
        """Runs fn(*inputs) without building its graph; saves the inputs. Returns the output."""
        if self._fn is not None:
            raise InvalidArgumentError("ReleasedActivation.checkpoint: already used; make one per call")
        self._fn = fn
        out = _Checkpoint.apply(self, *inputs)
        self._output = weakref.ref(out)
        self._version = out._version
        return out

    def release(self):
        """Frees the output's bytes (storage resized to 0; the tensor and its saved views remain).
        Call it after every consumer has saved the output, then register_recompute().

        Refuses (InvalidArgumentError, nothing released) an output that another tensor may read
        before backward: a view (its base and sibling views alias the bytes), one that does not
        cover its whole storage (the rest is someone else's data), or one modified in place after
        fn (the recomputed bytes would differ)."""
        out = self._output() if self._output is not None else None
        if out is None:
            raise InvalidArgumentError("ReleasedActivation.release: no output to release (not checkpointed, already "
                                       "released, or the output is gone)")
        if self._is_view:
            raise InvalidArgumentError("ReleasedActivation.release: the output is a view of another tensor, which "
                                       "(or another view of it) is a live alias of its bytes; return a fresh tensor "
                                       "from fn (e.g. .clone())")
        storage = _storage(out)
        nbytes = out.numel() * out.element_size()
        if out.storage_offset() != 0 or storage.nbytes() != nbytes or not _dense(out):
            raise InvalidArgumentError(f"ReleasedActivation.release: the output ({nbytes} bytes at offset "
                                       f"{out.storage_offset()}) is not its whole storage ({storage.nbytes()} bytes): "
                                       "the rest belongs to other tensors")
        if out._version != self._version:
            raise InvalidArgumentError("ReleasedActivation.release: the output was modified in place after fn; "
                                       "recomputation would not give those bytes back")
        self._shape, self._stride, self._dtype = out.shape, out.stride(), out.dtype
        if self._known is not None:
            # .data: the same storage under a version counter of its own, so writing the bytes back
            # does not move the output's, which the consumers' saved views check.
            self._into = out.data
        storage.resize_(0)
        self._storage, self._output = storage, None
        self.released_bytes = nbytes
        self.stats.bytes_released += nbytes
        self.stats.activations_released += 1

    def register_recompute(self, hook_tensor):
        """Recomputes (and restores the bytes) when hook_tensor's gradient is ready, i.e. just
        before hook_tensor's backward node runs. hook_tensor must come after every consumer of
        the output. Returns the hook's handle."""
        # A view's hook goes on its base: an in-place op on the view (x = mlp(x); x += r) gives the
        # view a new backward node and drops the old one from the graph; the base's node stays, and
        # it runs after the view's and before anything the view was computed from.
        if hook_tensor._base is not None:
            hook_tensor = hook_tensor._base
        if not hook_tensor.requires_grad or hook_tensor.grad_fn is None:
            raise InvalidArgumentError("ReleasedActivation.register_recompute: the hook tensor has no backward node "
                                       "(it does not require grad, or is a leaf), so its hook would not run first")
        return hook_tensor.register_hook(lambda grad: self._restore())

    def forget(self):
        """Drops the reference to the output when it will not be released."""
        self._output = None

    def _restore(self):
        # The first hook to fire puts the bytes back; a later one (several hook tensors) has nothing to do.
        if self._storage is not None:
            self._recompute(graph=self.graph_at_restore)

    def remember_modes(self, module):
        """Reruns in the train/eval modes module and its children have now, whatever they have when
        the rerun comes: model.eval() between forward and backward (an evaluation callback) would
        otherwise rerun a dropout inside the activation as the identity."""
        self._modes = tuple((m, m.training) for m in module.modules())

    def _replay_forward_state(self, stack):
        # The forward's generator state (dropout), autocast and train/eval modes, for as long as
        # the stack is open.
        stack.enter_context(_replayed_rng(self._device, self._rng))
        stack.enter_context(_in_modes(self._modes))
        for dev, on, dtype in self._autocast:
            stack.enter_context(torch.autocast(dev, enabled=on, dtype=dtype))

    def _recompute(self, graph=True):
        """Reruns fn from the saved inputs; puts the bytes back if they are released; keeps the
        graph for the backward node when `graph` (and there is a backward node)."""
        ctx = self._ctx() if self._ctx is not None else None
        inputs = ctx.saved_tensors if ctx is not None else self._inputs
        if inputs is None:
            raise StowageError("ReleasedActivation: nothing to recompute from (the backward node and its saved "
                               "inputs are gone)")
        if ctx is None and any(t._version != v for t, v in zip(inputs, self._versions)):
            raise StowageError("ReleasedActivation: an input was modified in place after the forward")
        if self._known is not None:
            if self._storage is not None:
                self._storage.resize_(self.released_bytes)
                with contextlib.ExitStack() as stack:
                    stack.enter_context(torch.no_grad())
                    if self._known.replay:
                        self._replay_forward_state(stack)
                    kept = self._known.into(self._into, *inputs)
                # Kept until the backward node, as the graph is (see graph_at_restore).
                self._kept = kept if ctx is not None and graph else None
                self._storage = self._into = None
                self.stats.recomputations += 1
            return
        it = iter(inputs)
        args = []
        for a in self._template:
            if a is _TENSOR:
                t = next(it)
                args.append(t.detach().requires_grad_(t.requires_grad))
            else:
                args.append(a)
        with contextlib.ExitStack() as stack:
            self._replay_forward_state(stack)
            keep = ctx is not None and graph
            stack.enter_context(torch.enable_grad() if keep else torch.no_grad())
            out = self._fn(*args)
        self.stats.recomputations += 1
        if self._storage is not None:
            if (out.shape, out.stride(), out.dtype) != (self._shape, self._stride, self._dtype) or \
                    _storage(out).nbytes() != self.released_bytes:
                raise StowageError(f"ReleasedActivation: the recomputed output ({tuple(out.shape)}, {out.stride()}, "
                                   f"{out.dtype}) does not match the released one ({tuple(self._shape)}, "
                                   f"{self._stride}, {self._dtype}): fn is not deterministic")
            # Storage-level copy: the tensor's version counter stays, so saved views still unpack.
            self._storage.resize_(self.released_bytes)
            self._storage.copy_(_storage(out))
            self._storage = None
        if keep:
            self._pending = (out, args)


def _flat_tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = [getattr(value, f.name, None) for f in dataclasses.fields(value)]  # init=False: maybe unset
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flat_tensors(v)]
    return []


_ROLE = "recomputed activation"  # the role of an activation's wrapper (_wrapping.wrapped_as)


def check_activation_types(what, option, types):
    """Refuses activation types that are not a list or tuple of classes (a class alone included)."""
    if not isinstance(types, (list, tuple)) or not all(isinstance(t, type) for t in types):
        raise InvalidArgumentError(f"{what}: {option} must be a list or tuple of module classes, e.g. "
                                   f"(torch.nn.GELU, torch.nn.SiLU) (got {types!r})")


class RecomputeHandle(WrapHandle):
    """What recompute_activations() returns: .stats (RecomputeStats), .modules (the wrapped names),
    .remove() (the model as it was). Also a context manager."""


def recompute_activations(model, activation_types=DEFAULT_ACTIVATIONS, names=()):
    """Releases the output of every activation module (an instance of one of activation_types, or
    named in names, e.g. "layers.0.mlp.act") when its parent module's forward returns, and
    recomputes it when the gradient reaches the parent's output. The model's code is unchanged;
    any module class works as an activation (SwiGLU written as a module, dropout inside). Refused:
    a module with forward hooks, one with trainable parameters called on an input that needs no
    gradient, and one an earlier handle that was not removed recomputes already.

    Rules: the activation's value must leave the parent only through the parent's outputs (a
    tensor stashed elsewhere would read released bytes), and backward must enter through them.
    Under no_grad / inference_mode nothing is saved and nothing is released.

    No module chosen (an activation called as a function, e.g. a SwiGLU written F.silu(gate) * up)
    is refused with InvalidArgumentError, as swap_activations refuses it. A deep copy or a pickle of
    the model is a plain model (stowage.torch._wrapping)."""
    check_activation_types("recompute_activations", "activation_types", activation_types)
    names = check_names("recompute_activations", "names", names)
    # Every name a module is held under: an activation instance shared by several layers (built
    # once, passed to each) is called by each of them, and each one is a parent to wrap.
    modules = dict(every_name(model))
    missing = [n for n in names if n not in modules]
    if missing:
        raise InvalidArgumentError(f"recompute_activations: no module named {', '.join(missing)}")
    aliases = {}
    for n, m in modules.items():
        aliases.setdefault(id(m), []).append(n)
    chosen, seen = [], set()
    for n, m in modules.items():
        if (n in names or isinstance(m, tuple(activation_types))) and id(m) not in seen:
            seen.add(id(m))
            chosen.append(n)
    if not chosen:
        # Nothing to release would leave the caller believing recomputation is on.
        looked_for = (f"no instance of {', '.join(t.__name__ for t in activation_types)}" if activation_types
                      else "activation_types empty")
        raise InvalidArgumentError(f"recompute_activations: no module was chosen ({looked_for}, no names "
                                   "given); an activation called as a function (F.silu(gate) * up) is no "
                                   "module: make it one and pass its class in activation_types, or name the "
                                   "modules in names (e.g. \"layers.0.mlp.act\")")
    for name in chosen:  # every refusal before anything is wrapped
        module = modules[name]
        if "" in aliases[id(module)]:
            raise InvalidArgumentError("recompute_activations: the model itself cannot be the activation (it needs "
                                       "a parent module whose forward consumes it)")
        if getattr(module, "inplace", False):
            raise InvalidArgumentError(f"recompute_activations: {name} is in-place; its output is its input's storage")
        if wrapped_as(module, _ROLE):
            # Wrapped twice, the outer handle would run the inner one's wrapper in its own rerun, outside
            # any forward the inner handle follows: the inner one would release nothing and warn.
            raise InvalidArgumentError(f"recompute_activations: {name} is already recomputed by an earlier handle "
                                       "(recompute_activations() or apply(recompute=True)) that was not removed; "
                                       "remove() that handle first")
        _refuse_hooks(module, name)
    stats, undo, frames, parents = RecomputeStats(), [], _Frames(), set()
    for name in chosen:
        for alias in aliases[id(modules[name])]:
            parent = modules[_caller(modules, alias)]
            if id(parent) not in parents:
                parents.add(id(parent))
                _wrap_parent(parent, frames, undo)
        _wrap_activation(modules[name], name, frames, stats, undo)

    # "Last forward": reset at each call of the model. A wrapper, as the modules' (not a forward
    # pre-hook): a deep copy or a pickle of the model drops it with theirs (_wrapping).
    model_forward = model.forward

    def new_forward(*args, **kwargs):
        stats.reset()
        return model_forward(*args, **kwargs)

    set_forward(model, new_forward, undo)
    return RecomputeHandle(stats, chosen, undo)


def _caller(modules, name):
    """The name of the module whose forward calls the activation `name`: its nearest ancestor that
    has a forward. A ModuleList or ModuleDict holding activations has none (the module above it
    loops over them), and a wrapper on it would never run."""
    parent = name.rpartition(".")[0]
    while parent and type(modules[parent]).forward is torch.nn.Module.forward and (
            "forward" not in modules[parent].__dict__):
        parent = parent.rpartition(".")[0]
    return parent


def _refuse_hooks(module, name):
    # A forward hook sees the output and may keep it; reading it after release would read freed memory.
    if module._forward_hooks or getattr(torch.nn.modules.module, "_global_forward_hooks", None):
        raise InvalidArgumentError(f"recompute_activations: {name} has forward hooks (or global ones are set), "
                                   "which may keep its output after it is released; remove them first")


class _Frames(threading.local):
    """One list per wrapped parent forward running in this thread, innermost last: an activation
    joins the innermost, whose return releases it (its nearest caller among the parents)."""

    def __init__(self):
        self.stack = []


def _wrap_activation(module, name, frames, stats, undo):
    original = module.forward

    warned = []

    def forward(*args, **kwargs):
        # Under torch.jit.trace the plain activation: the trace records the graph the model computes
        # (a checkpoint would be recorded as its own ops, and differ between the tracer's runs).
        if torch.jit.is_tracing():
            return original(*args, **kwargs)
        # Nothing to save under no_grad; outside its parent's forward nobody would release it.
        if not torch.is_grad_enabled() or not frames.stack:
            if torch.is_grad_enabled() and not warned:
                warned.append(True)
                warnings.warn(f"recompute_activations: {name} ran outside the forward of the module that holds "
                              "it, so its output is not released (called from elsewhere?); name the activations "
                              "its caller runs", stacklevel=callers_level())
            return original(*args, **kwargs)
        _refuse_hooks(module, name)
        if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args) and any(
                p.requires_grad for p in module.parameters()):
            # Its parameters' gradients flow only through a backward node, which an input that
            # needs no gradient does not make.
            raise InvalidArgumentError(f"recompute_activations: {name} has parameters that train but no input that "
                                       "needs a gradient; recompute it only where its input comes from a layer "
                                       "that trains")
        if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
            raise InvalidArgumentError(f"recompute_activations: {name} got a tensor keyword argument; pass tensors "
                                       "positionally (they are what is saved and recomputed from)")
        act = ReleasedActivation(stats)
        act.remember_modes(module)
        fn = original if not kwargs else (lambda *a: original(*a, **kwargs))
        out = act.checkpoint(fn, *args)
        frames.stack[-1].append((name, act))
        return out
    set_forward(module, forward, undo, role=_ROLE)


def _wrap_parent(parent, frames, undo):
    original, warned = parent.forward, []

    def forward(*args, **kwargs):
        frames.stack.append([])
        try:
            output = original(*args, **kwargs)
        finally:
            acts = frames.stack.pop()
        if acts:
            _release(acts, output, type(parent).__name__, warned)
        return output
    set_forward(parent, forward, undo)


def _release(acts, output, parent, warned):
    # By now every consumer inside the parent has run and saved what it needs.
    outputs = _flat_tensors(output)
    hooks = list({id(b): t for t in outputs for b in [t if t._base is None else t._base]
                  if b.requires_grad and b.grad_fn is not None}.values())  # one per base (see register_recompute)
    out_ptrs = {_storage(t).data_ptr() for t in outputs} - {0}
    chosen = []
    for name, act in acts:
        out = act._output() if act._output is not None else None
        if not hooks or out is None:
            if out is not None and out.requires_grad and not outputs and not warned:
                # Backward will run through it, but no output of the parent carries the hook.
                warned.append(True)
                warnings.warn(f"recompute_activations: a {parent} returned a {type(output).__name__} with no tensor "
                              f"in it that stowage can find (tensors, lists, tuples, dicts, dataclasses), so "
                              f"{name}'s output is not released", stacklevel=callers_level())
            act.forget()  # no backward through the parent: nothing saved it, nothing to gain
            continue
        if _storage(out).data_ptr() in out_ptrs:  # checked for all before any is released
            raise InvalidArgumentError(f"recompute_activations: {name}'s output is (or shares storage with) an output "
                                       "of its parent module, which the caller reads: it cannot be released")
        chosen.append(act)
    for act in chosen:
        # Each released output gets its hooks at once: a refused release (a view, an output
        # modified in place) leaves the ones before it restorable.
        act.graph_at_restore = len(chosen) == 1  # see ReleasedActivation.graph_at_restore
        act.release()
        for t in hooks:
            act.register_recompute(t)
