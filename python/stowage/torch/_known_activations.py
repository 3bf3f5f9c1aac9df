"""Activations recomputed straight into their released storage, with no rerun graph.

Known are torch's GeLU and SiLU, as `nn.GELU` / `nn.SiLU` modules (their own class, forward not
overridden, SiLU not in place) or as `F.gelu` / `F.silu` called on one tensor, and any module
whose class defines the two methods of the recompute protocol (stowage.torch.gpt.SwiGLU does):

    recompute_into(self, out, *inputs)           writes forward(*inputs)'s bytes into out; returns
                                                 what recompute_backward may reuse, or None
    recompute_backward(self, grad, kept, *inputs) the inputs' gradients (a tuple, one per input),
                                                 bit for bit what forward's own graph gives;
                                                 kept is recompute_into's value, or None

The restore then writes the output's bytes once (no second tensor, no copy) and backward runs
the kernels autograd itself would run (`gelu_backward`, `silu_backward` for torch's). Any other
fn takes the general path (rerun with a graph, copy).
"""
import torch

from ..errors import InvalidArgumentError

__all__ = ["KnownActivation", "known_activation"]


class KnownActivation:
    """into(out, *inputs) -> kept; backward(grad, kept, *inputs) -> the inputs' gradients."""

    __slots__ = ("name", "into", "backward")

    def __init__(self, name, into, backward):
        self.name, self.into, self.backward = name, into, backward


def _gelu(approximate):
    def into(out, x):
        torch._C._nn.gelu(x, approximate=approximate, out=out)

    def backward(grad, kept, x):
        return (torch.ops.aten.gelu_backward(grad, x, approximate=approximate),)
    return KnownActivation(f"gelu(approximate={approximate!r})", into, backward)


def _silu_into(out, x):
    torch._C._nn.silu(x, out=out)


def _silu_backward(grad, kept, x):
    return (torch.ops.aten.silu_backward(grad, x),)


_SILU = KnownActivation("silu", _silu_into, _silu_backward)


def known_activation(fn, args):
    """The KnownActivation that fn(*args) is, or None. Only floating-point tensors as arguments;
    a subclass of GELU or SiLU, an instance forward, an in-place SiLU or keyword arguments (fn is
    then a closure) are not recognised."""
    if not args or not all(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args):
        return None
    module, method = getattr(fn, "__self__", None), getattr(fn, "__func__", None)
    cls = type(module)
    if isinstance(module, torch.nn.Module) and method is getattr(cls, "forward", None):
        protocol = [callable(getattr(cls, name, None)) for name in ("recompute_into", "recompute_backward")]
        if all(protocol):
            return KnownActivation(cls.__name__, module.recompute_into, module.recompute_backward)
        if any(protocol):  # half a protocol is a mistake, not a request for the general path
            missing = "recompute_backward" if protocol[0] else "recompute_into"
            raise InvalidArgumentError(f"{cls.__name__} defines one method of stowage's recompute protocol but not "
                                       f"{missing}: define both (stowage.torch._known_activations) or neither")
    if len(args) != 1:
        return None
    if fn is torch.nn.functional.gelu:
        return _gelu("none")
    if cls is torch.nn.GELU and method is torch.nn.GELU.forward:
        return _gelu(getattr(module, "approximate", "none"))
    if fn is torch.nn.functional.silu or (cls is torch.nn.SiLU and method is torch.nn.SiLU.forward and not module.inplace):
        return _SILU
    return None
