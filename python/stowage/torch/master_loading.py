"""model.load_state_dict() on a model whose parameters a shared-storage optimizer holds: each
value loaded into such a parameter becomes its fp32 master, bit for bit, as it becomes the weight
of the fp32 model the optimizer replaced (docs/pytorch_optimizers.md, "Loading weights into the model").

torch copies a loaded value into the parameter itself, which is the bf16 view of the plane: the
residual would stay from the old master, and the master would be neither the old weight nor the
new one. A load_state_dict pre-hook on each module that owns such a parameter (any module above
it, a DistributedDataParallel wrapper too, reaches it through torch's own recursion) writes the
master first, then hands torch the view itself to copy, so torch's copy changes no bit. That copy
still counts as an in-place write (the parameter's _version), which the optimizer takes as a new
value from the user (its master becomes the bf16 value): a post-hook tells it no value changed."""
import contextlib
import weakref

import torch


class _MasterLoader:
    """The pre-hook (torch calls it with the module, as registered with with_module=True)."""

    def __init__(self, optimizer):
        self._optimizer = weakref.ref(optimizer)  # the model does not keep a dropped optimizer alive
        self.copied = []  # the parameters torch copies onto themselves, until the post-hook runs

    def __call__(self, module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                 error_msgs):
        opt = self._optimizer()
        self.copied = []  # (not those of a load that raised before its post-hook)
        if opt is None:
            return
        for name, p in module._parameters.items():
            value = state_dict.get(prefix + name)
            if p is None or not isinstance(value, torch.Tensor) or value.is_complex() or value.is_meta or (
                    not opt.holds_view(p)):
                continue  # not a master to write; torch loads it, or names what is wrong with it
            if p.dim() == 0 and value.shape == (1,):
                value = value[0]  # torch's own reading of a 1-element checkpoint for a 0-dim parameter
            if value.shape != p.shape:
                continue  # torch reports the size mismatch
            if not _aliases(value, p):  # model.load_state_dict(model.state_dict()) changes nothing, as in torch
                opt.load_master(p, value)  # split converts to fp32 as torch's copy into an fp32 weight does
            else:
                opt._take_write(p)  # a value written in place before stays the master
            self.copied.append(p)
            # torch then copies the parameter onto itself, or with assign=True (torch 2.1+) assigns it
            # to itself: the optimizer keeps stepping the tensor the model computes with.
            state_dict[prefix + name] = p

    def __deepcopy__(self, memo):
        return self  # a copy's parameters are its own, which the optimizer does not hold: nothing happens

    def __reduce__(self):
        # A pickled model (torch.save(model)) is a plain one and loads without stowage: the hook
        # loads as "".format, which takes any arguments and does nothing.
        return getattr, ("", "format")


class _AfterLoad:
    """The post-hook: the parameters the pre-hook handed torch were copied onto themselves."""

    def __init__(self, loader):
        self._loader = loader

    def __call__(self, module, incompatible_keys):
        opt, copied = self._loader._optimizer(), self._loader.copied
        self._loader.copied = []
        for p in copied if opt is not None else ():
            opt._copied_onto_itself(p)

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        # In a pickled (plain) model: a callable that takes any arguments and returns None, as a post-hook must.
        return getattr, (contextlib.nullcontext(), "__exit__")


def _aliases(value, p):
    """value is the parameter's own bf16 view (model.state_dict() gives the parameters themselves)."""
    return (value.dtype == p.dtype and value.device == p.device and value.data_ptr() == p.data_ptr()
            and value.stride() == p.stride())


def route_loads(model, optimizer, routed):
    """Registers the pre-hook on every module of `model` that owns one of `optimizer`'s parameters
    and is not in `routed` (a weakref.WeakSet of the modules done, which it adds them to)."""
    for module in model.modules():
        if module not in routed and any(p is not None and optimizer.holds_view(p)
                                        for p in module._parameters.values()):
            loader = _MasterLoader(optimizer)
            module._register_load_state_dict_pre_hook(loader, with_module=True)
            module.register_load_state_dict_post_hook(_AfterLoad(loader))
            routed.add(module)
