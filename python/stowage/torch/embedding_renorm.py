"""nn.Embedding / nn.EmbeddingBag with max_norm on a shared-storage optimizer's weight
(docs/pytorch_optimizers.md, in-place writes).

With max_norm set, every forward renormalises the rows it looks up in place
(torch.embedding_renorm_, under no_grad): rows whose norm exceeds max_norm are scaled down. That
bumps the weight's _version at every forward, even when no row exceeds max_norm, and the optimizer
takes a moved _version as a write of the whole parameter (its master becomes the bf16 value): every
row's low bits went at every step and small updates vanished. attach() hooks such modules: a
forward pre-hook keeps a bf16 copy of the rows the input looks up, a forward hook compares them
bit for bit with the rows after the forward, and only the rows that changed take the in-place rule
(their master is their bf16 value exactly); the others keep their master bit for bit. Only modules
that run torch's own forward are hooked (a subclass's forward may look up other rows than its input
names), and a forward given another input than the pre-hook saw (by a pre-hook registered later)
leaves the write whole.

Cost per forward of a hooked module: torch.unique of the input and two gathers of the rows it looks
up (on CUDA, unique waits for the device); rows that changed write their residual and tie bits.
"""
import contextlib
import weakref

import torch


def _nothing():
    """What a hook pickles as: a callable that takes any arguments and returns None (a pre-hook
    that returned something would replace the module's input), so a pickled model (torch.save)
    loads as a plain one, without stowage."""
    return getattr, (contextlib.nullcontext(), "__exit__")


def _version(x):
    """x's version count; None for what has none (not a tensor, or an inference tensor)."""
    return x._version if isinstance(x, torch.Tensor) and not x.is_inference() else None


class _Watch:
    """The rows one module's forward may renormalise, from its pre-hook to its forward hook."""

    def __init__(self, optimizer):
        self._optimizer = weakref.ref(optimizer)  # the model does not keep a dropped optimizer alive
        # (id(module), the input and its version, the weight's version seen, the rows looked up or
        # None: all, their bf16 values)
        self._before = None

    def before(self, module, args, kwargs=None):
        self._before = None  # (not those of a forward that raised before its forward hook ran)
        opt = self._optimizer()
        # Under torch.jit.trace the snapshot would be recorded into the graph: the renorm of a traced
        # forward is taken as any in-place write is (the whole table).
        if opt is None or module.max_norm is None or torch.jit.is_tracing():
            return
        weight = module.weight
        version = opt._unwritten_version(weight)
        if version is None:
            return  # not the optimizer's view, or a write to take whole already pending
        x = args[0] if args else (kwargs or {}).get("input")
        if isinstance(x, torch.Tensor) and x.dtype not in (torch.int32, torch.int64):
            return  # no index: torch refuses it itself
        with torch.no_grad():
            if isinstance(x, torch.Tensor):
                rows = torch.unique(x.detach())  # sorted; index_select refuses an index out of range, as embedding does
                saved = weight.detach().index_select(0, rows)
            else:  # the input by keyword under torch < 2.0 (hooks get no kwargs there): the whole table
                rows, saved = None, weight.detach().clone()
        self._before = (id(module), x, _version(x), version, rows, saved)

    def after(self, module, args, kwargs=None):
        before, self._before = self._before, None
        opt = self._optimizer()
        if before is None or before[0] != id(module) or opt is None:
            return
        _, x, x_version, version, rows, saved = before
        if rows is not None:
            # A pre-hook registered after this one may have given forward another input (one that
            # returns a new one, or writes into it): the rows looked up are not the ones saved. The
            # renorm then stays a write of the whole table, as any in-place write.
            now = args[0] if args else (kwargs or {}).get("input")
            if now is not x or _version(now) != x_version:
                return
        opt._take_renorm(module.weight, version, rows, saved)


class _Before:
    def __init__(self, watch):
        self._watch = watch

    def __call__(self, module, args, kwargs=None):
        self._watch.before(module, args, kwargs)

    def __deepcopy__(self, memo):
        return self  # a copy's weight is its own, which the optimizer does not hold: nothing happens

    def __reduce__(self):
        return _nothing()


class _After(_Before):
    def __call__(self, module, args, *kwargs_output):  # (kwargs, output) where torch passes them, else (output,)
        self._watch.after(module, args, kwargs_output[0] if len(kwargs_output) == 2 else None)


def _register(register, hook):
    """The hook, given the keyword arguments too where torch passes them (2.0 and newer)."""
    try:
        return register(hook, with_kwargs=True)
    except TypeError:
        return register(hook)


def _torchs_forward(module):
    """The module runs torch's own nn.Embedding / nn.EmbeddingBag forward, which looks up the rows
    its input names. A subclass that overrides forward may look up others (Hugging Face's
    BartLearnedPositionalEmbedding looks up positions + offset): a snapshot of the rows its input
    names would miss the ones renormalised, so it is not hooked (the whole table is taken)."""
    forward = type(module).forward
    return "forward" not in vars(module) and forward in (torch.nn.Embedding.forward, torch.nn.EmbeddingBag.forward)


def watch_renorms(model, optimizer, hooked):
    """Hooks every nn.Embedding / nn.EmbeddingBag of `model` with max_norm set that runs torch's own
    forward, whose weight is one of `optimizer`'s parameters (its plane's view) and that is not in
    `hooked` (a weakref.WeakKeyDictionary of module -> its hooks' handles, which it adds them to)."""
    for module in model.modules():
        if (isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.max_norm is not None
                and _torchs_forward(module) and module not in hooked and optimizer.holds_view(module.weight)):
            watch = _Watch(optimizer)
            # Appended: update_overlap's pre-hook (prepended, or registered before by attach()) first
            # makes the stream wait for the update of these rows.
            hooked[module] = (_register(module.register_forward_pre_hook, _Before(watch)),
                              _register(module.register_forward_hook, _After(watch)))


def unhook(hooked):
    """Removes the hooks watch_renorms() registered (when the optimizer goes)."""
    for handles in list(hooked.values()):
        for handle in handles:
            handle.remove()
    hooked.clear()
