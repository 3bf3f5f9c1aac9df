"""model.load_state_dict() on a model whose parameters a shared-storage optimizer holds: each
value loaded into such a parameter becomes its fp32 master, bit for bit, as it becomes the weight
of the fp32 model the optimizer replaced (docs/pytorch.md, "Loading weights into the model").

torch copies a loaded value into the parameter itself, which is the bf16 view of the plane: the
residual would stay from the old master, and the master would be neither the old weight nor the
new one. A load_state_dict pre-hook on each module that owns such a parameter (any module above
it, a DistributedDataParallel wrapper too, reaches it through torch's own recursion) writes the
master first, then hands torch the view itself to copy, so torch's copy changes no bit."""
import weakref

import torch


class _MasterLoader:
    """The pre-hook (torch calls it with the module, as registered with with_module=True)."""

    def __init__(self, optimizer):
        self._optimizer = weakref.ref(optimizer)  # the model does not keep a dropped optimizer alive

    def __call__(self, module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                 error_msgs):
        opt = self._optimizer()
        if opt is None or local_metadata.get("assign_to_params_buffers", False):
            return  # assign=True replaces the parameter: step() then refuses it (docs/pytorch.md)
        for name, p in module._parameters.items():
            value = state_dict.get(prefix + name)
            if p is None or not isinstance(value, torch.Tensor) or value.is_complex() or not opt.holds_view(p):
                continue  # not a master to write; torch loads it, or names what is wrong with it
            if p.dim() == 0 and value.shape == (1,):
                value = value[0]  # torch's own reading of a 1-element checkpoint for a 0-dim parameter
            if value.shape != p.shape:
                continue  # torch reports the size mismatch
            opt.load_master(p, value.detach().to(torch.float32))  # a float64 value rounds as torch's copy does
            state_dict[prefix + name] = p.detach()  # torch copies the view onto itself: no bit changes

    def __deepcopy__(self, memo):
        return self  # a copy's parameters are its own, which the optimizer does not hold: nothing happens

    def __reduce__(self):
        # A pickled model (torch.save(model)) is a plain one and loads without stowage: the hook
        # loads as "".format, which takes any arguments and does nothing.
        return getattr, ("", "format")


def route_loads(model, optimizer, routed):
    """Registers the pre-hook on every module of `model` that owns one of `optimizer`'s parameters
    and is not in `routed` (a weakref.WeakSet of the modules done, which it adds them to)."""
    for module in model.modules():
        if module not in routed and any(p is not None and optimizer.holds_view(p)
                                        for p in module._parameters.values()):
            module._register_load_state_dict_pre_hook(_MasterLoader(optimizer), with_module=True)
            routed.add(module)
