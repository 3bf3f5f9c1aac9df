"""One call that applies stowage's techniques to an existing model and optimizer, the way
MindSpeed's adaptor does; the training loop stays as it is (docs/pytorch.md, "One entry point")."""
import weakref

import torch

from .. import precision
from ..errors import InvalidArgumentError, UnsupportedError
from ._wrapping import check_names
from .offload import check_options
from .optim import (SharedStorageAdamW, SharedStorageSGD, checked_entry, decoupled_disagree, is_real,
                    sparse_gradient_error)
from .recompute import DEFAULT_ACTIVATIONS, check_activation_types, recompute_activations
from .swap import swap_activations


class Applied:
    """What apply() did: the optimizer to step (the shared-storage one, which replaces the one given,
    or the one given), the recompute and swap handles (None when not asked for); remove() undoes
    the module wrapping."""

    def __init__(self, optimizer, recompute, swap):
        self.optimizer = optimizer
        self.recompute = recompute
        self.swap = swap

    def remove(self):
        """Refused, with nothing undone, when a handle made after these wrapped the same modules."""
        handles = [h for h in (self.swap, self.recompute) if h is not None]  # newest first
        top = {}
        for handle in handles:
            handle.check_removable(top)
        for handle in handles:
            handle.remove()
        self.recompute = self.swap = None


# torch.optim's own switches, not hyper-parameters: the fused optimizers take none of them. Those that
# change the numbers or the step's nature are refused when on; foreach and fused only pick torch's
# implementation, which the fused step replaces.
_REFUSED_SWITCHES = ("amsgrad", "maximize", "capturable", "differentiable")
_IMPLEMENTATION_SWITCHES = ("foreach", "fused")


def _kept(settings, adam):
    """A param group or the defaults as the shared-storage optimizer takes them: every key kept (the
    user's own too: a name, an lr scale a scheduler reads), torch.optim's switches left out; for
    Adam, torch's decoupled_weight_decay (newer torch; AdamW is Adam with it on) read as `decoupled`
    and kept (a state_dict loaded into torch.optim.Adam then steps as it did), else a `decoupled`
    the group has, else AdamW's True and Adam's False; the two given unlike are refused."""
    on = [k for k in _REFUSED_SWITCHES if settings.get(k)]
    if on:
        raise UnsupportedError(f"shared storage: {', '.join(on)} {'is' if len(on) == 1 else 'are'} not "
                               "supported (the fused step has no such form)")
    kept = {k: v for k, v in settings.items() if k not in _REFUSED_SWITCHES + _IMPLEMENTATION_SWITCHES}
    if adam is not None:
        if decoupled_disagree(kept):
            raise InvalidArgumentError(f"shared storage: a group's decoupled={kept['decoupled']!r} and "
                                       f"decoupled_weight_decay={kept['decoupled_weight_decay']!r} disagree")
        kept["decoupled"] = bool(kept.get("decoupled_weight_decay", kept.get("decoupled", adam is torch.optim.AdamW)))
    return kept


def _shared_optimizer(optimizer, rounding, max_grad_norm, skip_nonfinite, state_offload, state_device_budget,
                      overlap_update):
    common = dict(rounding=rounding, max_grad_norm=max_grad_norm, skip_nonfinite=skip_nonfinite,
                  state_offload=state_offload, state_device_budget=state_device_budget,
                  overlap_update=overlap_update)
    if isinstance(optimizer, (SharedStorageAdamW, SharedStorageSGD)):
        raise InvalidArgumentError(f"apply(): the optimizer is already a {type(optimizer).__name__} (an earlier "
                                   "apply() made it); to add recompute or swap, call apply() with "
                                   "shared_storage=False")
    kinds = {torch.optim.AdamW: SharedStorageAdamW, torch.optim.Adam: SharedStorageAdamW,
             torch.optim.SGD: SharedStorageSGD}
    kind = kinds.get(type(optimizer))
    if kind is None:
        raise UnsupportedError(f"shared storage: {type(optimizer).__name__} has no fused form; give torch.optim."
                               "AdamW, Adam or SGD")
    adam = type(optimizer) if kind is SharedStorageAdamW else None
    groups = [_kept(g, adam) for g in optimizer.param_groups]
    defaults = _kept(optimizer.defaults, adam)
    _check_resumable(optimizer, kind)
    made = kind(groups, **common)
    # A group added later (add_param_group: unfreezing) takes the user's defaults, as it would from torch's.
    made.defaults.update(defaults)
    if optimizer.state:  # a resumed optimizer: its moments and step carry over, the master is the fp32 weights
        saved = optimizer.state_dict()
        # Only the state: the groups are already made's (torch's switches left out, decoupled added).
        saved["param_groups"] = [{**{k: v for k, v in g.items() if k != "params"}, "params": s["params"]}
                                 for g, s in zip(made.param_groups, saved["param_groups"])]
        made.load_state_dict(saved)
    return made


# What a replaced optimizer refuses: each would step, save or change state the new one no longer shares.
_RETIRED = ("step", "state_dict", "load_state_dict", "add_param_group")


def _replaced_error(optimizer, what):
    new = optimizer._stowage_replaced_by()
    by = f"the {type(new).__name__} " if new is not None else "the optimizer "
    return InvalidArgumentError(
        f"{what}: this {type(optimizer).__name__} was replaced by {by}that stowage.torch.adaptor.apply() returned "
        "(Applied.optimizer): its parameters are bf16 views of that optimizer's planes, which hold the fp32 masters "
        "and the state. Use that optimizer instead (step it, save and load its state_dict(), make LR schedulers "
        "and checkpointing helpers on it)")


def _retired(name):
    def refuse(self, *args, **kwargs):
        raise _replaced_error(self, f"{name}()")
    refuse.__name__ = name
    return refuse


class _WeakMethod:
    """A retired optimizer's refusal, set on the instance: a bound method's __func__ and __self__
    (an LR scheduler wraps step through them) without a strong reference back. A bound method
    there would make a cycle (optimizer, its __dict__, the method): the optimizer, the parameters it
    lists and their storage (the shared-storage planes) would wait for Python's cyclic collector
    after the user drops them."""

    def __init__(self, name, optimizer):
        self.__func__ = _retired(name)
        self.__name__ = name
        self._optimizer = weakref.ref(optimizer)

    @property
    def __self__(self):
        return self._optimizer()

    def __call__(self, *args, **kwargs):
        optimizer = self._optimizer()
        if optimizer is None:
            raise InvalidArgumentError(f"{self.__name__}(): the optimizer it belongs to was replaced by "
                                       "stowage.torch.adaptor.apply() and is gone")
        return self.__func__(optimizer, *args, **kwargs)


_RETIRED_TYPES = {}  # an optimizer class -> its retired form


def _retired_type(cls):
    """cls, whose copies and pickles are refused: torch.optim.Optimizer's __getstate__ keeps only
    defaults, state and param_groups, so a copy would lose the refusals and step the bf16 views'
    copies as fp32 weights. Named as cls (isinstance and the messages see the user's class)."""
    made = _RETIRED_TYPES.get(cls)
    if made is None:
        def __getstate__(self):
            raise _replaced_error(self, "copy.deepcopy() or pickle")
        made = _RETIRED_TYPES[cls] = type(cls.__name__, (cls,), {"__getstate__": __getstate__, "__module__":
                                                                 cls.__module__, "__qualname__": cls.__qualname__})
    return made


def _retire(optimizer, made):
    """After a shared-storage apply(): `optimizer` (the one given) refuses _RETIRED, and its
    param_groups are `made`'s, so an LR scheduler made on it before apply() sets the lr that `made`
    steps with. Its own state, which `made` copied, is dropped. Methods on the instance: a
    scheduler made on it later wraps them (it calls step's __func__) and still reaches the refusal."""
    optimizer._stowage_replaced_by = weakref.ref(made)
    optimizer.param_groups = made.param_groups
    optimizer.state.clear()
    for name in _RETIRED:
        setattr(optimizer, name, _WeakMethod(name, optimizer))
    optimizer.__class__ = _retired_type(type(optimizer))


def _check_options(shared_storage, rounding, max_grad_norm, skip_nonfinite, recompute, recompute_activation_types,
                   recompute_names, swap, swap_prefetch, swap_names, state_offload, state_device_budget,
                   overlap_update):
    """Every option's type and value, before anything changes."""
    for name, value in (("shared_storage", shared_storage), ("skip_nonfinite", skip_nonfinite),
                        ("recompute", recompute), ("swap", swap), ("overlap_update", overlap_update)):
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"apply(): {name} must be True or False (got {value!r})")
    if not isinstance(rounding, str) or rounding not in precision.ROUNDINGS:
        raise InvalidArgumentError(f"apply(): rounding must be 'nearest_even' or 'half_up' (got {rounding!r})")
    if max_grad_norm is not None and not (is_real(max_grad_norm) and max_grad_norm > 0):
        raise InvalidArgumentError(f"apply(): max_grad_norm must be a number > 0 or None (got {max_grad_norm!r})")
    if isinstance(swap_prefetch, bool) or not isinstance(swap_prefetch, int) or swap_prefetch < 0:
        raise InvalidArgumentError(f"apply(): swap_prefetch must be an int >= 0 (got {swap_prefetch!r})")
    check_activation_types("apply()", "recompute_activation_types", recompute_activation_types)
    check_names("apply()", "recompute_names", recompute_names)
    check_names("apply()", "swap_names", swap_names)
    check_options(state_offload, state_device_budget)


def _check_resumable(optimizer, kind):
    """A resumed optimizer's state must fit before any parameter moves (a refusal changes nothing):
    each entry as load_state_dict() will check it, complete (AdamW: exp_avg and exp_avg_sq) included."""
    for p, entry in optimizer.state.items():  # checked only: no copy (the state may be meant to leave the device)
        kind._completed(checked_entry(entry, p, kind._state_keys, kind.__name__, home=lambda value: value,
                                      optional=kind._optional_keys))


def _check_covered(model, optimizer):
    """Shared storage makes the optimizer's parameters bf16; a floating parameter of the model it does
    not hold (a frozen backbone left out of it) would stay as it is and the model would mix dtypes,
    failing at the first forward. Refused before anything changes. Parameters already bf16 (cast by
    the user, or held by another shared-storage optimizer) are fine."""
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    left = [(name, p) for name, p in model.named_parameters()
            if id(p) not in held and p.is_floating_point() and p.dtype != torch.bfloat16]
    if not left:
        return
    shown = ", ".join(f"{name} ({str(p.dtype).replace('torch.', '')}"
                      f"{', requires_grad=False' if not p.requires_grad else ''})" for name, p in left[:8])
    more = f" and {len(left) - 8} more" if len(left) > 8 else ""
    raise InvalidArgumentError(
        f"apply(): the optimizer does not hold {len(left)} parameter{'s' if len(left) > 1 else ''} of the model: "
        f"{shown}{more}. shared_storage=True makes the parameters it holds bf16, so these would keep their dtype "
        "and the model would mix dtypes. Give them to the optimizer in a param group with lr=0 (frozen "
        "parameters have no gradient and are never stepped), cast them to torch.bfloat16 yourself, or pass "
        "apply() the submodule this optimizer trains. Nothing was changed")


def _check_dense(model, optimizer):
    """An embedding made with sparse=True gives its weight sparse gradients, which the fused step
    refuses: known from the model, so refused here before anything changes rather than at the first
    step. A frozen one makes no gradient and passes (unfrozen later, step() refuses it the same way)."""
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse:
            w = module.weight
            if id(w) in held and w.requires_grad:
                which = f"parameter '{name + '.' if name else ''}weight' {tuple(w.shape)}"
                raise sparse_gradient_error("apply()", f"{which} gets sparse gradients from {type(module).__name__}"
                                            "(sparse=True)", "Nothing was changed")


def apply(model, optimizer, *, shared_storage=True, rounding="nearest_even", max_grad_norm=None,
          skip_nonfinite=True, recompute=False, recompute_activation_types=DEFAULT_ACTIVATIONS,
          recompute_names=(), swap=False, swap_prefetch=1, swap_names=(), state_offload="none",
          state_device_budget=None, overlap_update=False):
    """Applies the chosen techniques to `model` (fp32, unchanged otherwise) and `optimizer` (a
    torch.optim.AdamW, Adam or SGD over the model's parameters). Returns an Applied whose
    .optimizer the loop then steps.

    shared_storage: the parameters become bf16 views of split storage and the optimizer becomes
      the fused SharedStorageAdamW / SharedStorageSGD with the same groups and hyper-parameters.
    recompute: the outputs of activation modules (recompute_activation_types, or the modules named
      in recompute_names) are released after forward and recomputed before backward.
    swap: what attention modules (classes named *Attention, or the modules in swap_names) save for
      backward goes to host memory after forward and comes back swap_prefetch modules ahead.
    state_offload ("mapped" or "streamed"), state_device_budget (bytes of optimizer state each
      device keeps, or None): the shared-storage optimizer's m and v (momentum buffer) go to host
      memory, for the parameters that do not fit in the budget (stowage.torch.offload).
    overlap_update: the shared-storage optimizer's step() queues the update of CUDA parameters on
      a side stream, and the next forward waits for it module by module
      (stowage.torch.update_overlap): the update, bound by the host link when the state is
      offloaded, runs beside the first layers' forward. Reads of the weights outside a forward
      after step() call optimizer.wait_for_update() first.

    Options of the wrong type (a switch that is not True or False, a number given as a str or a
    bool) are refused with InvalidArgumentError naming them, before anything changes. After a shared-storage apply() the
    optimizer given is replaced: its step(), state_dict(), load_state_dict() and add_param_group()
    raise InvalidArgumentError naming the new one, its param_groups are the new one's (an LR
    scheduler made on it before sets the new one's lr), and its state is dropped (the new one
    holds a copy). A refused apply() leaves it as it was.
    """
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError("apply(): model must be a torch.nn.Module")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidArgumentError("apply(): optimizer must be a torch.optim.Optimizer")
    if hasattr(optimizer, "_stowage_replaced_by"):
        raise _replaced_error(optimizer, "apply()")
    _check_options(shared_storage, rounding, max_grad_norm, skip_nonfinite, recompute, recompute_activation_types,
                   recompute_names, swap, swap_prefetch, swap_names, state_offload, state_device_budget,
                   overlap_update)
    if not shared_storage and max_grad_norm is not None:
        raise InvalidArgumentError("apply(): max_grad_norm is the fused clipping of shared storage; without it, "
                                   "call torch.nn.utils.clip_grad_norm_ in the loop")
    if not shared_storage and overlap_update:
        raise InvalidArgumentError("apply(): overlap_update overlaps the shared-storage optimizer's update; give "
                                   "shared_storage=True with it")
    if not shared_storage and state_offload != "none":
        raise InvalidArgumentError("apply(): state_offload moves the state of the shared-storage optimizers; give "
                                   "shared_storage=True with it")
    if shared_storage:
        _check_covered(model, optimizer)
        _check_dense(model, optimizer)
    done = Applied(optimizer, None, None)
    try:  # a refusal anywhere leaves the model as it was
        if recompute:
            done.recompute = recompute_activations(model, activation_types=recompute_activation_types,
                                                   names=recompute_names)
        if swap:
            done.swap = swap_activations(model, prefetch=swap_prefetch, names=swap_names)
        if shared_storage:
            done.optimizer = _shared_optimizer(optimizer, rounding, max_grad_norm, skip_nonfinite, state_offload,
                                               state_device_budget, overlap_update)
            done.optimizer.attach(model)
    except Exception:
        done.remove()
        raise
    if shared_storage:
        _retire(optimizer, done.optimizer)
    return done
