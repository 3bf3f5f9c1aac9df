"""Activations recomputed straight into their released storage: torch's GeLU and SiLU, as
`nn.GELU` / `nn.SiLU` modules (their own class, forward not overridden) or as `F.gelu` / `F.silu`
called on one tensor.

Their backward reads only the input, so nothing needs the rerun's graph: the restore writes the
output's bytes once, with the out= form of the same kernel (no second tensor, no copy), and the
gradient comes from the backward kernel autograd itself calls for them (`gelu_backward`,
`silu_backward`), bit for bit. Any other fn takes the general path (rerun with a graph, copy).
"""
import torch

__all__ = ["KnownActivation", "known_activation"]


class KnownActivation:
    """into(x, out): fn(x)'s bytes written into out; backward(grad, x): the gradient fn's own
    backward node would give."""

    __slots__ = ("name", "into", "backward")

    def __init__(self, name, into, backward):
        self.name, self.into, self.backward = name, into, backward


def _gelu(approximate):
    return KnownActivation(
        f"gelu(approximate={approximate!r})",
        lambda x, out: torch._C._nn.gelu(x, approximate=approximate, out=out),
        lambda grad, x: torch.ops.aten.gelu_backward(grad, x, approximate=approximate))


_SILU = KnownActivation("silu", lambda x, out: torch._C._nn.silu(x, out=out),
                        lambda grad, x: torch.ops.aten.silu_backward(grad, x))


def known_activation(fn, args):
    """The KnownActivation that fn(*args) is, or None. Only a floating-point tensor alone as the
    argument; a module subclass, an instance forward, an in-place SiLU or keyword arguments (fn
    is then a closure) are not recognised."""
    if len(args) != 1 or not isinstance(args[0], torch.Tensor) or not args[0].is_floating_point():
        return None
    module, method = getattr(fn, "__self__", None), getattr(fn, "__func__", None)
    if fn is torch.nn.functional.gelu:
        return _gelu("none")
    if type(module) is torch.nn.GELU and method is torch.nn.GELU.forward:
        return _gelu(getattr(module, "approximate", "none"))
    if fn is torch.nn.functional.silu or (
            type(module) is torch.nn.SiLU and method is torch.nn.SiLU.forward and not module.inplace):
        return _SILU
    return None
