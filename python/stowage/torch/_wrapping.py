"""What the techniques that wrap an unmodified model's modules share: replacing a module's
forward so it can be put back, and the handle that puts everything back.

A wrapped forward belongs to the module it was put on and to its handle. A deep copy of the
model (copy.deepcopy: an EMA model, e.g. timm's ModelEmaV2, torch.optim.swa_utils.AveragedModel)
and a pickle of it (torch.save(model)) are plain models: each module of the copy has the forward
it had before wrapping, running on the copy's own weights, and the technique (its statistics, its
remove()) stays with the original, which goes on as before.

nn.DataParallel's replicas are refused: a replica copies its module's __dict__, so it would run
the original's wrapped forward (the original's weights, the technique's state shared across the
replicas' threads). A wrapped module's replication raises instead; DistributedDataParallel, one
process per device, does not replicate modules. A deep copy's replicas run their own class's
forward. A pickled model loads with each wrapped module's forward bound to it in its __dict__
(nothing of stowage's is needed to load it), which replicas would copy: build such a model from
its class and load_state_dict() it before replicating (docs/pytorch.md)."""
import copy
import operator
import os
import sys
import weakref

import torch

from ..errors import InvalidArgumentError, StowageError


def callers_level():
    """warnings.warn's stacklevel of the first frame outside torch and this package: the line of the
    user's code that called the module or the optimizer (how many frames torch puts between varies
    by version). Called by the function that warns."""
    inside = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
    level, frame = 2, sys._getframe(2)  # 1: the function that warns, whose caller is frame 2
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        level, frame = level + 1, frame.f_back
    return level


def storage_of(t):
    """The tensor's bytes as an untyped storage: untyped_storage() from torch 2.0; 1.13 has only
    the TypedStorage view of the same StorageImpl."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage().untyped()


class _ClassForward:
    """The forward (or another method, `name`) of a module copied from a wrapped one whose class's
    method was in use: the copy's __dict__ needs a value under that name, and this one holds the
    copy weakly (a bound method would make a cycle, and a copy of a large model on a GPU would then
    wait for the garbage collector to give its memory back)."""

    def __init__(self, module, name="forward"):
        self._module = weakref.ref(module)
        self._name = name

    def _target(self):
        module = self._module()
        if module is None:
            raise StowageError("this forward belongs to a copy of a wrapped module, and that copy has been freed")
        return module

    def __call__(self, *args, **kwargs):
        module = self._target()
        return getattr(type(module), self._name).__get__(module, type(module))(*args, **kwargs)

    @property
    def __wrapped__(self):
        # inspect.signature(copy.forward) names the model's own parameters, as _Wrapped's does
        # (made on each access: a reference kept here would make the cycle the weak one avoids).
        module = self._target()
        return getattr(type(module), self._name).__get__(module, type(module))

    def __deepcopy__(self, memo):
        twin = memo.get(id(self._module()))
        return _ClassForward(twin, self._name) if twin is not None else self

    def __reduce__(self):
        # Loads as the class's method bound to the loaded module (getattr before the module's
        # state is set finds the class's): nothing of stowage's is needed to load it. That bound
        # method in the module's __dict__ is a reference cycle: a loaded model's memory goes back
        # when the garbage collector runs, not at its last `del` (docs/pytorch.md).
        return getattr, (self._target(), self._name)


class _NoReplicas:
    """A wrapped module's _replicate_for_data_parallel (the method nn.DataParallel's replicate()
    calls on every module): refuses, see the module's docstring. Copies and pickles of the module
    are plain models and get the class's method back, as they get its forward."""

    def __init__(self, module):
        self.module = module

    def __call__(self, *args, **kwargs):
        raise InvalidArgumentError(
            f"nn.DataParallel cannot replicate a {type(self.module).__name__} whose forward a stowage "
            "technique wrapped: each replica would run the original's wrapped forward. Use "
            "DistributedDataParallel (one process per device), or remove() the technique first")

    def __deepcopy__(self, memo):
        twin = memo.get(id(self.module))
        return _PlainReplicas(twin) if twin is not None else self

    def __reduce__(self):
        return getattr, (self.module, "_replicate_for_data_parallel")  # as _ClassForward.__reduce__


class _PlainReplicas(_ClassForward):
    """A deep copy's _replicate_for_data_parallel: the class's, and the replica drops the copy's
    _ClassForward (which would call the copy's forward) so it runs its own class's forward."""

    def __init__(self, module):
        super().__init__(module, "_replicate_for_data_parallel")

    def __call__(self):
        replica = super().__call__()
        if isinstance(replica.__dict__.get("forward"), _ClassForward):
            del replica.__dict__["forward"]
        replica.__dict__.pop("_replicate_for_data_parallel", None)
        return replica

    def __deepcopy__(self, memo):
        twin = memo.get(id(self._module()))
        return _PlainReplicas(twin) if twin is not None else self


class _Wrapped:
    """A technique's forward on one module: calls `forward`; remembers what it replaced."""

    def __init__(self, module, forward, had, old):
        self.module, self.forward, self.had, self.old = module, forward, had, old
        # inspect.signature(model.forward) follows __wrapped__ to the forward this one calls: code
        # that reads the parameters' names (Hugging Face's Trainer picks dataset columns by them)
        # sees the model's own.
        self.__wrapped__ = module.forward

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def __deepcopy__(self, memo):
        twin = memo.get(id(self.module))
        if twin is None:  # copied on its own, not as part of its module: kept, as deepcopy keeps functions
            return self
        if self.had:  # what was there before (another technique's wrapper peels the same way)
            return copy.deepcopy(self.old, memo)
        return _ClassForward(twin)

    def __reduce__(self):
        if self.had:
            return operator.itemgetter(0), ((self.old,),)  # loads as the forward it replaced
        return getattr, (self.module, "forward")  # as _ClassForward.__reduce__


class WrapHandle:
    """.stats (the technique's statistics), .modules (the wrapped modules' names), .remove() (the
    model as it was). Also a context manager."""

    def __init__(self, stats, modules, undo):
        self.stats, self.modules, self._undo = stats, modules, undo

    def remove(self):
        """Puts back every forward this handle replaced, newest first. Refused (InvalidArgumentError)
        when another wrapper was put on one of those modules after this handle's: then nothing is
        undone (the check runs before anything changes)."""
        self.check_removable()
        while self._undo:
            w = self._undo.pop()
            if w.had:
                w.module.forward = w.old
            else:
                del w.module.forward
            if w.refuses_replicas:
                w.module.__dict__.pop("_replicate_for_data_parallel", None)

    def check_removable(self, top=None):
        """Raises remove()'s refusal, changing nothing. `top` (id(module) -> what its forward will be
        after the removals checked before this one) lets several handles be checked as one removal,
        newest first; it is updated as if this one were removed."""
        top = {} if top is None else top
        for w in reversed(self._undo):
            current = top[id(w.module)] if id(w.module) in top else w.module.__dict__.get("forward")
            if current is not w:
                raise InvalidArgumentError(f"remove(): another wrapper was put on the forward of a "
                                           f"{type(w.module).__name__} after this one; remove the handles in the "
                                           "reverse order of their creation (nothing was undone)")
            top[id(w.module)] = w.old if w.had else None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def set_forward(module, forward, undo, role=None):
    """module.forward = forward (wrapped, see the module's docstring), with its restore appended to
    `undo` (a forward set on the instance before is put back; otherwise the class's shows through
    again). `role` names what the wrapper does to the module, for wrapped_as()."""
    had = "forward" in module.__dict__
    wrapped = _Wrapped(module, forward, had, module.__dict__.get("forward"))
    wrapped.role = role
    # The first wrapper put on a module (the last one removed) refuses its replication.
    wrapped.refuses_replicas = "_replicate_for_data_parallel" not in module.__dict__
    if wrapped.refuses_replicas:
        module._replicate_for_data_parallel = _NoReplicas(module)
    module.forward = wrapped
    undo.append(wrapped)


def wrapped_as(module, role):
    """Whether a wrapper of `role` that is still in place (its handle not removed) is among the
    forwards stacked on `module`."""
    forward = module.__dict__.get("forward")
    while isinstance(forward, _Wrapped):
        if getattr(forward, "role", None) == role:
            return True
        forward = forward.old if forward.had else None
    return False


def check_names(what, option, names):
    """Refuses `names` that are not a collection of qualified module names (a str would be taken
    one character at a time). Returns them as a tuple."""
    if not isinstance(names, (list, tuple, set, frozenset)) or not all(isinstance(n, str) for n in names):
        raise InvalidArgumentError(f"{what}: {option} must be a list or tuple of module names (str), e.g. "
                                   f"[\"layers.0.mlp.act\"] (got {names!r})")
    return tuple(names)


def every_name(module, prefix="", path=()):
    """(name, module) for every path to every module: named_modules(remove_duplicate=False), which
    recurses for ever in a module graph with a cycle (a submodule holding its ancestor); a module
    already on the path is not entered again."""
    yield prefix, module
    path = path + (id(module),)
    for name, child in module._modules.items():
        if child is not None and id(child) not in path:
            yield from every_name(child, f"{prefix}.{name}" if prefix else name, path)
