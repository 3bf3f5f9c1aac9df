"""The baseline the shared-storage optimizers are held to: plain PyTorch with fp32 master weights
and a separate bf16 copy the model computes with (6 bytes per parameter), updated by AdamW or SGD
written as one PyTorch operation per line of docs/precision.md's operation order.

Each operation is one IEEE fp32 operation rounded on its own, so after every step the master is
bit-identical to what stowage's fused kernels keep in split storage. Each is computed in float64 and
rounded to float32 once: for +, -, *, / and sqrt of fp32 operands that is the correctly rounded fp32
result (53 >= 2 * 24 + 2 bits), whatever vector code a PyTorch build runs for fp32 (some builds'
CPU kernels are not correctly rounded in the last bit). (torch.optim.AdamW itself computes
m + (1 - beta1) * g and v + (1 - beta2) * g * g as fused or reordered operations on some builds, so it
can differ from both in the last bit.)

As torch.optim, each parameter counts its own steps: one without a gradient in a step (stochastic
depth, an unrouted expert, an unused branch) is skipped and its count does not move, so its bias
correction (AdamW) and the start of its momentum buffer (SGD) follow its own count.
"""
import math

import torch

from ..errors import InvalidArgumentError


def _f32(x):
    """x rounded to fp32, as a Python float (what the C ABI's float arguments hold)."""
    return float(torch.tensor(x, dtype=torch.float32))


def _fp32(x):
    """x (a float64 tensor holding one exact operation's result) rounded once to fp32."""
    return x.to(torch.float32)


def _scale(x, s):
    """x * s (s an fp32 value) as one correctly rounded fp32 multiplication, in place."""
    return x.copy_(_fp32(x.double() * s))


def _add(x, y):
    """x + y, one correctly rounded fp32 addition, in place."""
    return x.copy_(_fp32(x.double() + y.double()))


def _sub(x, y):
    return x.copy_(_fp32(x.double() - y.double()))


def _div(x, y):
    """x / y as a new fp32 tensor (y a tensor or an fp32 value)."""
    return _fp32(x.double() / (y.double() if isinstance(y, torch.Tensor) else y))


def _sqrt(x):
    return _fp32(x.double().sqrt())


class MasterWeightsOptimizer:
    """Keeps an fp32 master for each (bf16) parameter of `params`; step() updates the masters
    and copies each, rounded to nearest even, into its parameter."""

    def __init__(self, params, kind="adamw", lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 momentum=0.0, max_grad_norm=None, skip_nonfinite=True, loss_scale=1.0):
        if kind not in ("adamw", "sgd"):
            raise InvalidArgumentError(f"kind {kind!r} is neither 'adamw' nor 'sgd'")
        self.params = list(params)
        self.masters = [p.detach().float().clone() for p in self.params]
        for p in self.params:
            p.data = p.detach().to(torch.bfloat16)
        self.kind, self.lr, self.betas, self.eps, self.wd = kind, lr, betas, eps, weight_decay
        self.momentum, self.max_grad_norm = momentum, max_grad_norm
        self.skip_nonfinite, self.loss_scale = skip_nonfinite, loss_scale
        self.steps = 0  # step() calls applied (not skipped)
        self.counts = [0] * len(self.params)  # per parameter: the steps it took (torch.optim's state["step"])
        self.m = [torch.zeros_like(m) for m in self.masters]
        self.v = [torch.zeros_like(m) for m in self.masters]
        self.last_step_skipped = False

    def zero_grad(self, set_to_none=True):
        """set_to_none=False zeroes the gradients instead, as torch.optim's zero_grad() does by
        default before PyTorch 2.0: a parameter then left out of a backward (a skipped block) has
        a zero gradient and is stepped, where with None it is skipped."""
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    def storage_bytes(self):
        return sum(m.numel() * 4 + p.numel() * 2 for m, p in zip(self.masters, self.params))

    def _grads(self):
        return [(i, p.grad.float()) for i, p in enumerate(self.params) if p.grad is not None]

    def step(self):
        grads = self._grads()
        self.last_step_skipped = self.skip_nonfinite and any(not torch.isfinite(g).all() for _, g in grads)
        if self.last_step_skipped:
            return
        clip = 1.0
        if self.max_grad_norm is not None and grads:
            norms = torch.stack([torch.linalg.vector_norm(g, 2.0) for _, g in grads])
            total = float(torch.linalg.vector_norm(norms, 2.0)) / self.loss_scale
            clip = min(1.0, self.max_grad_norm / (total + 1e-6))
        self.steps += 1
        inv_scale, clip = _f32(1.0 / _f32(self.loss_scale)), _f32(clip)
        for i, g in grads:
            self.counts[i] += 1
            g = _scale(_scale(g.clone(), inv_scale), clip)
            if self.kind == "adamw":
                self._adamw(i, g)
            else:
                self._sgd(i, g)
            self.params[i].data.copy_(self.masters[i].to(torch.bfloat16))

    def _adamw(self, i, g):
        p, m, v = self.masters[i], self.m[i], self.v[i]
        lr, b1, b2, wd = _f32(self.lr), _f32(self.betas[0]), _f32(self.betas[1]), _f32(self.wd)
        t = self.counts[i]  # this parameter's own count, as torch.optim.AdamW's bias correction
        if wd != 0:
            _scale(p, _f32(1.0 - lr * wd))
        _add(_scale(m, b1), _scale(g.clone(), _f32(1.0 - b1)))
        _add(_scale(v, b2), _scale(_fp32(g.double() * g.double()), _f32(1.0 - b2)))
        denom = _div(_sqrt(v), _f32(math.sqrt(1.0 - b2 ** t)))
        _add(denom, torch.full_like(denom, _f32(self.eps)))
        _sub(p, _scale(_div(m, denom), _f32(lr / (1.0 - b1 ** t))))

    def _sgd(self, i, g):
        p, buf = self.masters[i], self.m[i]
        if self.wd != 0:
            g = _add(g, _scale(p.clone(), _f32(self.wd)))
        if self.momentum != 0:
            if self.counts[i] == 1:  # its first step starts the buffer, as torch.optim.SGD's
                buf.copy_(g)
            else:
                _add(_scale(buf, _f32(self.momentum)), g)
            g = buf
        _sub(p, _scale(g.clone(), _f32(self.lr)))
