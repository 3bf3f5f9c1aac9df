"""One call that applies stowage's techniques to an existing model and optimizer, the way
MindSpeed's adaptor does; the training loop stays as it is (docs/pytorch.md, "One entry point")."""
import torch

from ..errors import InvalidArgumentError, UnsupportedError
from .offload import check_options
from .optim import SharedStorageAdamW, SharedStorageSGD, checked_entry
from .recompute import DEFAULT_ACTIVATIONS, recompute_activations
from .swap import swap_activations


class Applied:
    """What apply() did: the optimizer to step (the shared-storage one, or the one given), the
    recompute and swap handles (None when not asked for); remove() undoes the module wrapping."""

    def __init__(self, optimizer, recompute, swap):
        self.optimizer = optimizer
        self.recompute = recompute
        self.swap = swap

    def remove(self):
        for handle in (self.swap, self.recompute):
            if handle is not None:
                handle.remove()
        self.recompute = self.swap = None


def _shared_optimizer(optimizer, rounding, max_grad_norm, skip_nonfinite, state_offload, state_device_budget):
    groups = [dict(g) for g in optimizer.param_groups]
    common = dict(rounding=rounding, max_grad_norm=max_grad_norm, skip_nonfinite=skip_nonfinite,
                  state_offload=state_offload, state_device_budget=state_device_budget)
    if type(optimizer) in (torch.optim.AdamW, torch.optim.Adam):
        if any(g.get("amsgrad") or g.get("maximize") for g in groups):
            raise UnsupportedError("shared storage: amsgrad and maximize are not supported")
        keep = ("params", "lr", "betas", "eps", "weight_decay")
        decoupled = type(optimizer) is torch.optim.AdamW
        _check_resumable(optimizer, SharedStorageAdamW)
        made = SharedStorageAdamW([{**{k: g[k] for k in keep}, "decoupled": decoupled} for g in groups], **common)
    elif type(optimizer) is torch.optim.SGD:
        if any(g.get("maximize") for g in groups):
            raise UnsupportedError("shared storage: maximize is not supported")
        keep = ("params", "lr", "momentum", "dampening", "weight_decay", "nesterov")
        _check_resumable(optimizer, SharedStorageSGD)
        made = SharedStorageSGD([{k: g[k] for k in keep} for g in groups], **common)
    else:
        raise UnsupportedError(f"shared storage: {type(optimizer).__name__} has no fused form; give torch.optim."
                               "AdamW, Adam or SGD")
    if optimizer.state:  # a resumed optimizer: its moments and step carry over, the master is the fp32 weights
        made.load_state_dict(optimizer.state_dict())
    return made


def _check_resumable(optimizer, kind):
    """A resumed optimizer's state must fit before any parameter moves (a refusal changes nothing)."""
    for p, entry in optimizer.state.items():  # checked only: no copy (the state may be meant to leave the device)
        checked_entry(entry, p, kind._state_keys, kind.__name__, home=lambda value: value)


def apply(model, optimizer, *, shared_storage=True, rounding="nearest_even", max_grad_norm=None,
          skip_nonfinite=True, recompute=False, recompute_activation_types=DEFAULT_ACTIVATIONS,
          recompute_names=(), swap=False, swap_prefetch=1, swap_names=(), state_offload="none",
          state_device_budget=None):
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
    """
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError("apply(): model must be a torch.nn.Module")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidArgumentError("apply(): optimizer must be a torch.optim.Optimizer")
    if not shared_storage and max_grad_norm is not None:
        raise InvalidArgumentError("apply(): max_grad_norm is the fused clipping of shared storage; without it, "
                                   "call torch.nn.utils.clip_grad_norm_ in the loop")
    check_options(state_offload, state_device_budget)
    if not shared_storage and state_offload != "none":
        raise InvalidArgumentError("apply(): state_offload moves the state of the shared-storage optimizers; give "
                                   "shared_storage=True with it")
    done = Applied(optimizer, None, None)
    try:  # a refusal anywhere leaves the model as it was
        if recompute:
            done.recompute = recompute_activations(model, activation_types=recompute_activation_types,
                                                   names=recompute_names)
        if swap:
            done.swap = swap_activations(model, prefetch=swap_prefetch, names=swap_names)
        if shared_storage:
            done.optimizer = _shared_optimizer(optimizer, rounding, max_grad_norm, skip_nonfinite, state_offload,
                                               state_device_budget)
    except Exception:
        done.remove()
        raise
    return done
