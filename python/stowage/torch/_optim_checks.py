"""What the shared-storage optimizers (stowage.torch.optim) check before they change anything:
each param group before any parameter moves into planes, and each state tensor before the fused
kernel is given its address."""
import torch

from .. import _lib, memory
from ..errors import InvalidArgumentError, UnsupportedError


def param_list(params):
    if isinstance(params, (set, frozenset)):
        raise InvalidArgumentError("a parameter group's params must be ordered (a list), not a set")
    return [params] if isinstance(params, torch.Tensor) else list(params)


def check_param(p):
    if not isinstance(p, torch.Tensor) or not p.is_leaf:
        raise InvalidArgumentError("shared-storage optimizers take leaf parameters (model.parameters())")
    if p.device.type == "cuda":
        if not memory.using_cuda():
            raise UnsupportedError(f"shared-storage optimizers: parameter on {p.device}, but {_lib.path()} is not "
                                   "using CUDA (built without it, or STOWAGE_DEVICE=emulated)")
    elif p.device.type != "cpu":
        raise UnsupportedError(f"shared-storage optimizers: parameter on {p.device}; CPU and CUDA tensors are "
                               "supported")
    if p.dtype != torch.float32:
        raise InvalidArgumentError(f"shared-storage optimizers: parameter of {p.dtype}; give the fp32 model (its "
                                   "values become the master weights exactly)")


def decoupled_as_torch_says(group, peer):
    """An AdamW group's two names for one switch, made alike in `group` (returned) where only one
    is given: `decoupled` (what the Adam step reads) and torch's decoupled_weight_decay (newer
    torch.optim.Adam's, kept so a state_dict loaded there steps the same way). Only where the
    peer (the group it updates, or the defaults) has `decoupled`: an AdamW optimizer's. Both
    given and unlike: refused where it is checked."""
    if "decoupled" not in peer:
        return group
    if "decoupled_weight_decay" in group and "decoupled" not in group:
        group["decoupled"] = bool(group["decoupled_weight_decay"])
    elif "decoupled" in group and "decoupled_weight_decay" not in group and "decoupled_weight_decay" in peer:
        group["decoupled_weight_decay"] = bool(group["decoupled"])
    return group


def decoupled_disagree(group):
    """Both names of the switch given, and unlike."""
    return "decoupled" in group and "decoupled_weight_decay" in group and bool(group["decoupled"]) != bool(
        group["decoupled_weight_decay"])


def check_group(group, defaults, check_hyper_parameters, held, what):
    """Everything add_param_group() needs of `group` (its params a list), checked before any
    parameter moves: a parameter moved and then refused has lost its fp32 low bits. `held`: the
    ids of the parameters other groups hold. Returns the ids of the group's parameters."""
    check_hyper_parameters({**defaults, **decoupled_as_torch_says(dict(group), defaults)}, what)
    mine = {}
    for n, p in enumerate(group["params"]):
        if id(p) in held:
            raise InvalidArgumentError(f"{what}: some parameters appear in more than one parameter group")
        if id(p) in mine:  # torch.optim only warns; moved twice, the parameter would lose its master
            raise InvalidArgumentError(f"{what}: parameter {n} of the param group is parameter {mine[id(p)]} again; "
                                       "list each parameter once")
        check_param(p)
        mine[id(p)] = n
    devices = {p.device for p in group["params"]}
    if len(devices) > 1:  # a group's planes are on one device
        raise InvalidArgumentError(f"{what}: a param group's parameters must be on one device (got "
                                   f"{', '.join(sorted(map(str, devices)))})")
    return set(mine)


def state_value(t, p, key, home_devices, which):
    """A tensor put in opt.state[p][key] by hand as the values the state starts from, in p's
    shape (torch.zeros_like(p) is bf16 now: as torch.optim would, its values are read in fp32);
    refused where it has no such values. which(): p's name for the message."""
    fits = (isinstance(t, torch.Tensor) and t.layout == torch.strided and t.is_floating_point()
            and t.numel() == p.numel() and t.device in home_devices)
    if not fits:
        got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise InvalidArgumentError(
            f"step(): {which()} has state['{key}'] of {got}; the fused step takes a floating tensor of "
            f"{p.numel()} elements {tuple(p.shape)} on {' or '.join(sorted(map(str, home_devices)))} (kept as "
            "fp32). No parameter was updated")
    return t.detach().reshape(p.shape)
