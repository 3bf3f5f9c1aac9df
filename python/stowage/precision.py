"""BF16/FP32 shared storage on host memory through the C ABI (docs/precision.md): an fp32 master
kept as a bf16 plane (what compute reads), a residual plane and, for round-to-nearest-even, a
tie bitmap; split, merge, the finite check and the fused AdamW / SGD steps on those planes.

Pointers are addresses as ints (a tensor's data_ptr(), a numpy array's ctypes.data): host memory
for the plain calls; with `device` (a stowage device ordinal) and `stream` (a cudaStream_t as an
int, 0 for the default stream), memory of that device, the step queued on that stream. No torch
is needed here. stowage.torch.optim builds optimizers on this.
"""
import ctypes

from . import _lib
from .errors import InvalidArgumentError

HALF_UP = 0
NEAREST_EVEN = 1
_ROUNDING = {"half_up": HALF_UP, "nearest_even": NEAREST_EVEN}
ROUNDINGS = tuple(_ROUNDING)


def rounding_code(rounding):
    """"half_up" or "nearest_even" (the spelling `stowage estimate` and `stowage demo` take)."""
    if not isinstance(rounding, str) or rounding not in _ROUNDING:
        raise InvalidArgumentError(f"rounding {rounding!r} is neither 'half_up' nor 'nearest_even'")
    return _ROUNDING[rounding]


def tie_bitmap_bytes(numel, rounding):
    return (numel + 7) // 8 if rounding_code(rounding) == NEAREST_EVEN else 0


class Planes(ctypes.Structure):
    _fields_ = [("bf16", ctypes.c_void_p), ("residual", ctypes.c_void_p), ("ties", ctypes.c_void_p),
                ("numel", ctypes.c_size_t), ("rounding", ctypes.c_int)]


class _GradScaling(ctypes.Structure):
    _fields_ = [("loss_scale", ctypes.c_float), ("clip_coef", ctypes.c_float), ("skip_nonfinite", ctypes.c_int)]


class _AdamOptions(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_float), ("beta1", ctypes.c_float), ("beta2", ctypes.c_float),
                ("eps", ctypes.c_float), ("weight_decay", ctypes.c_float), ("decoupled_weight_decay", ctypes.c_int)]


class _SgdOptions(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_float), ("momentum", ctypes.c_float), ("dampening", ctypes.c_float),
                ("weight_decay", ctypes.c_float), ("nesterov", ctypes.c_int)]


def planes(bf16, residual, ties, numel, rounding):
    """The C struct for planes at these addresses (ties: 0 in half_up mode)."""
    for address, what in ((bf16, "bf16"), (residual, "residual"), (ties, "ties")):
        _lib.fits(address, ctypes.c_void_p, f"planes: {what}")
    return Planes(bf16 or None, residual or None, ties or None, _lib.fits(numel, ctypes.c_size_t, "planes: numel"),
                  rounding_code(rounding))


def _grad_bits(bits):
    if bits not in (16, 32):
        raise InvalidArgumentError(f"grad_bits {bits} is neither 32 (fp32) nor 16 (bf16)")
    return bits


def split(src, dst):
    """numel fp32 values at address `src` into the Planes `dst`."""
    _lib.call_int("stowage_split", src or None, ctypes.byref(dst))


def merge(src, dst):
    """The Planes `src` into numel fp32 values at address `dst`."""
    _lib.call_int("stowage_merge", ctypes.byref(src), dst or None)


def any_nonfinite(grad, grad_bits, numel):
    """True when any of the numel gradients at `grad` (fp32: 32, bf16: 16) is Inf or NaN."""
    return _lib.call_int("stowage_any_nonfinite", grad or None, _grad_bits(grad_bits), numel) == 1


def _scaling(loss_scale, clip_coef, skip_nonfinite):
    return _GradScaling(loss_scale, clip_coef, 1 if skip_nonfinite else 0)


def _placed(name, device, stream):
    """The entry point and its leading arguments: host memory, or queued on a device's stream."""
    if device is None:
        return name, ()
    return name + "_async", (device, stream or None)


def adam_step(weights, grad, grad_bits, m, v, step, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
              decoupled=True, loss_scale=1.0, clip_coef=1.0, skip_nonfinite=True, device=None, stream=0):
    """One fused Adam(W) step on the Planes `weights`; m and v are fp32 addresses. `step` is the
    number of steps applied so far. Returns (applied, new step)."""
    count = ctypes.c_int64(_lib.fits(step, ctypes.c_int64, "adam_step: step"))
    options = _AdamOptions(lr, beta1, beta2, eps, weight_decay, 1 if decoupled else 0)
    name, lead = _placed("stowage_adam_step", device, stream)
    applied = _lib.call_int(name, *lead, ctypes.byref(weights), grad or None, _grad_bits(grad_bits),
                            m or None, v or None, ctypes.byref(options),
                            ctypes.byref(_scaling(loss_scale, clip_coef, skip_nonfinite)), ctypes.byref(count))
    return applied == 1, count.value


def sgd_step(weights, grad, grad_bits, momentum_buffer, step, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
             nesterov=False, loss_scale=1.0, clip_coef=1.0, skip_nonfinite=True, device=None, stream=0):
    """One fused SGD step (PyTorch's formulation); momentum_buffer: an fp32 address, or 0 without
    momentum. Returns (applied, new step)."""
    count = ctypes.c_int64(_lib.fits(step, ctypes.c_int64, "sgd_step: step"))
    options = _SgdOptions(lr, momentum, dampening, weight_decay, 1 if nesterov else 0)
    name, lead = _placed("stowage_sgd_step", device, stream)
    applied = _lib.call_int(name, *lead, ctypes.byref(weights), grad or None, _grad_bits(grad_bits),
                            momentum_buffer or None, ctypes.byref(options),
                            ctypes.byref(_scaling(loss_scale, clip_coef, skip_nonfinite)), ctypes.byref(count))
    return applied == 1, count.value


class StepTensor(ctypes.Structure):
    """One tensor of a multi-tensor call: its planes, gradient, state (Adam: m and v; SGD: the
    momentum buffer in state0, or 0) and step count, which an applied step increments."""
    _fields_ = [("weights", Planes), ("grad", ctypes.c_void_p), ("grad_bits", ctypes.c_int),
                ("state0", ctypes.c_void_p), ("state1", ctypes.c_void_p), ("step", ctypes.c_int64)]


def step_tensors(entries):
    """A C array of StepTensor from (planes, grad, grad_bits, state0, state1, step) tuples."""
    def address(value, what):
        return _lib.fits(value, ctypes.c_void_p, f"step_tensors: {what}") or None

    return (StepTensor * len(entries))(*[StepTensor(w, address(g, "grad"), _grad_bits(bits), address(s0, "state0"),
                                                    address(s1, "state1"),
                                                    _lib.fits(step, ctypes.c_int64, "step_tensors: step"))
                                         for w, g, bits, s0, s1, step in entries])


def any_nonfinite_multi(tensors, device=None, stream=0, flag=0):
    """True when any gradient of the StepTensor array `tensors` is Inf or NaN: one call, and on a
    device one wait for all. flag: the address of one int of the device's memory the check may
    overwrite (0: stowage's allocator gives one)."""
    if device is None:
        return _lib.call_int("stowage_any_nonfinite_multi", len(tensors), tensors) == 1
    return _lib.call_int("stowage_any_nonfinite_multi_async", device, stream or None, len(tensors), tensors,
                         flag or None) == 1


def adam_step_multi(tensors, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, decoupled=True,
                    loss_scale=1.0, clip_coef=1.0, skip_nonfinite=True, device=None, stream=0):
    """adam_step for every tensor of the StepTensor array, one decision on non-finite gradients
    for all; each tensor's step count is updated in the array. Returns whether the steps applied."""
    options = _AdamOptions(lr, beta1, beta2, eps, weight_decay, 1 if decoupled else 0)
    name, lead = _placed("stowage_adam_step_multi", device, stream)
    return _lib.call_int(name, *lead, len(tensors), tensors, ctypes.byref(options),
                         ctypes.byref(_scaling(loss_scale, clip_coef, skip_nonfinite))) == 1


def sgd_step_multi(tensors, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, loss_scale=1.0,
                   clip_coef=1.0, skip_nonfinite=True, device=None, stream=0):
    """sgd_step for every tensor of the StepTensor array (state0: the momentum buffer, or 0)."""
    options = _SgdOptions(lr, momentum, dampening, weight_decay, 1 if nesterov else 0)
    name, lead = _placed("stowage_sgd_step_multi", device, stream)
    return _lib.call_int(name, *lead, len(tensors), tensors, ctypes.byref(options),
                         ctypes.byref(_scaling(loss_scale, clip_coef, skip_nonfinite))) == 1


def synchronize(device, stream=0):
    """Waits for the work queued on `stream` of stowage device `device`."""
    _lib.call_int("stowage_synchronize", device, stream or None)
