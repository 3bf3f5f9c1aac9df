"""Activations recomputed straight into their released storage, with no rerun graph.

Known are torch's GeLU and SiLU, as `nn.GELU` / `nn.SiLU` modules (their own class, forward not
overridden, SiLU not in place) or as `F.gelu` / `F.silu` called on one tensor (torch's own: not
when someone replaced them), and any module whose class defines the two methods of the recompute
protocol, together with or below its forward, and has no parameter that trains
(stowage.torch.gpt.SwiGLU does):

    recompute_into(self, out, *inputs)           writes forward(*inputs)'s bytes into out; returns
                                                 what recompute_backward may reuse, or None
    recompute_backward(self, grad, kept, *inputs) the inputs' gradients (a tuple, one per input),
                                                 bit for bit what forward's own graph gives;
                                                 kept is recompute_into's value, or None

The restore then writes the output's bytes once (no second tensor, no copy) and backward runs
the kernels autograd itself would run (`gelu_backward`, `silu_backward` for torch's). A protocol
module's recompute_into runs under the forward's generator state and autocast, replayed as the
general path replays them. Any other fn takes the general path (rerun with a graph, copy): a
subclass that overrides forward but inherits the protocol (the protocol is its parent's), and a
module whose parameters train (recompute_backward gives the inputs' gradients only).
"""
import torch

from ..errors import InvalidArgumentError

__all__ = ["KnownActivation", "known_activation"]


class KnownActivation:
    """into(out, *inputs) -> kept; backward(grad, kept, *inputs) -> the inputs' gradients;
    replay: into runs under the forward's generator state and autocast (a protocol module's)."""

    __slots__ = ("into", "backward", "replay")

    def __init__(self, into, backward, replay=False):
        self.into, self.backward, self.replay = into, backward, replay


def _gelu(approximate):
    def into(out, x):
        torch._C._nn.gelu(x, approximate=approximate, out=out)

    def backward(grad, kept, x):
        return (torch.ops.aten.gelu_backward(grad, x, approximate=approximate),)
    return KnownActivation(into, backward)


def _silu_into(out, x):
    torch._C._nn.silu(x, out=out)


def _silu_backward(grad, kept, x):
    return (torch.ops.aten.silu_backward(grad, x),)


_SILU = KnownActivation(_silu_into, _silu_backward)


def _defined_by(cls, name):
    """The class in cls's method resolution order whose own body defines name, or None."""
    return next((c for c in cls.__mro__ if name in c.__dict__), None)


def _protocol(module, method):
    """A protocol module's KnownActivation, or None."""
    cls = type(module)
    forward = _defined_by(cls, "forward")
    if method is not getattr(cls, "forward", None):
        return None  # an instance forward (another wrapper's, say): not what the class describes
    into, backward = _defined_by(cls, "recompute_into"), _defined_by(cls, "recompute_backward")
    if (into is None) != (backward is None):  # half a protocol is a mistake, not a request for the general path
        raise InvalidArgumentError(f"{cls.__name__} defines one method of stowage's recompute protocol but not "
                                   f"{'recompute_backward' if backward is None else 'recompute_into'}: define both "
                                   "(stowage.torch._known_activations) or neither")
    if into is None or not (issubclass(into, forward) and issubclass(backward, forward)):
        return None  # no protocol, or one written for a forward a subclass replaced
    if any(p.requires_grad for p in module.parameters()):
        return None  # their gradients flow only through a graph
    return KnownActivation(module.recompute_into, module.recompute_backward, replay=True)


def _torch_own(fn, module_name):
    """fn is torch's own function of that module, not a replacement someone assigned."""
    return getattr(fn, "__module__", None) == module_name


def known_activation(fn, args):
    """The KnownActivation that fn(*args) is, or None. Only floating-point tensors as arguments;
    a subclass of GELU or SiLU, an instance forward, an in-place SiLU, keyword arguments (fn is
    then a closure) or a replaced F.gelu / F.silu / forward are not recognised."""
    if not args or not all(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args):
        return None
    module, method = getattr(fn, "__self__", None), getattr(fn, "__func__", None)
    cls = type(module)
    if isinstance(module, torch.nn.Module) and cls not in (torch.nn.GELU, torch.nn.SiLU):
        return _protocol(module, method)
    if len(args) != 1:
        return None
    functional = torch.nn.functional
    approximate = "none"
    if cls in (torch.nn.GELU, torch.nn.SiLU):  # judged as the functional call its forward makes
        if method is not cls.forward or not _torch_own(method, "torch.nn.modules.activation"):
            return None
        if cls is torch.nn.SiLU and module.inplace:
            return None
        fn = functional.gelu if cls is torch.nn.GELU else functional.silu
        approximate = getattr(module, "approximate", "none")
    if fn is functional.gelu and functional.gelu is torch._C._nn.gelu:
        return _gelu(approximate)
    if fn is functional.silu and _torch_own(functional.silu, "torch.nn.functional"):
        return _SILU
    return None
