"""Tensors in stowage's memory handed to a DLPack consumer without a copy:
`torch.from_dlpack(stowage.empty((4, 1024), "float32"))` (also NumPy, JAX, CuPy), where the
consumer reads the dtype: "bool" (kDLBool) needs PyTorch with pytorch/pytorch#108486 (not 2.0 or
older) or NumPy 1.25+, "bfloat16" a consumer that has it (docs/pytorch.md)."""
import ctypes
import math

from . import _lib
from .errors import InvalidArgumentError

# DLPack type codes (dlpack.h): kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6 (newer than
# some readers: torch 1.13 raises "Unsupported code 6"; a uint8 tensor viewed as bool copies nothing).
_DTYPES = {
    "float32": (2, 32), "float16": (2, 16), "float64": (2, 64), "bfloat16": (4, 16),
    "int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64),
    "uint8": (1, 8), "uint16": (1, 16), "bool": (6, 8),
}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]

# A capsule's name must outlive it: it stays for the life of the module.
_CAPSULE_NAME = b"dltensor"
_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _delete(managed_address):
    managed = ctypes.cast(managed_address, ctypes.POINTER(_DLManagedTensor))
    if managed.contents.deleter:
        managed.contents.deleter(managed)


def _capsule_destructor():
    """libstowage's C destructor: gives back the memory of a capsule no consumer took. (One written
    in Python cannot run while the consumer that refused the capsule has its exception pending.)"""
    return ctypes.cast(_lib.library().stowage_dlpack_capsule_destructor, ctypes.c_void_p)


class Buffer:
    """A contiguous tensor in stowage's memory, until exported with __dlpack__ (once)."""

    def __init__(self, managed_address):
        self._managed = managed_address
        t = ctypes.cast(managed_address, ctypes.POINTER(_DLManagedTensor)).contents.dl_tensor
        self.data_ptr = t.data or 0
        self.shape = tuple(t.shape[i] for i in range(t.ndim))
        self.dtype = next(name for name, code in _DTYPES.items() if code == (t.dtype.code, t.dtype.bits))
        self.nbytes = math.prod(self.shape) * t.dtype.bits // 8
        self._device = (t.device.device_type, t.device.device_id)

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, stream=None, **kwargs):
        # The memory is fresh (no pending writes), so no stream needs to wait for it.
        if self._managed is None:
            raise InvalidArgumentError("this stowage Buffer was already exported; a Buffer exports once")
        capsule = _api.PyCapsule_New(self._managed, _CAPSULE_NAME, _capsule_destructor())
        self._managed = None  # the capsule owns it now (a failed PyCapsule_New left it to this Buffer)
        return capsule

    def __del__(self):
        if getattr(self, "_managed", None) is not None:
            _delete(self._managed)
            self._managed = None

    def __repr__(self):
        return f"stowage.Buffer(shape={self.shape}, dtype={self.dtype}, data_ptr={self.data_ptr:#x})"


def _shape_and_type(shape, dtype, what):
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise InvalidArgumentError(f"{what}: dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(not isinstance(d, int) or d < 0 for d in shape):
        raise InvalidArgumentError(f"{what}: shape {shape} must be non-negative integers")
    for d in shape:  # a C int64_t each: ctypes would take 2**64 + 5 as 5
        _lib.fits(d, ctypes.c_int64, f"{what}: shape {shape}")
    code, bits = _DTYPES[name]
    return (ctypes.c_int64 * max(len(shape), 1))(*shape), len(shape), code, bits


def empty(shape, dtype="float32", device=0, stream=0):
    """A new contiguous tensor of `shape` and `dtype` (a name such as "bfloat16", or a
    torch.dtype) in stowage's memory on `device`, allocated on `stream`."""
    dims, ndim, code, bits = _shape_and_type(shape, dtype, "stowage.empty")
    managed = _lib.library().stowage_dlpack_empty(device, dims, ndim, code, bits, stream or None)
    _lib.check(managed, lambda m: not m)
    return Buffer(managed)


def host_empty(shape, dtype="float32", device=0):
    """A new contiguous tensor in `device`'s pinned host pool (docs/host_pool.md): host memory on
    the NUMA node(s) nearest the device, pinned for it once and reused. On CUDA, copies to and from
    it run asynchronously and kernels may address it directly. CPU data to DLPack consumers. The
    pool does not order reuse by streams: keep the tensor until the copies that use it are done."""
    dims, ndim, code, bits = _shape_and_type(shape, dtype, "stowage.host_empty")
    managed = _lib.library().stowage_dlpack_host_empty(device, dims, ndim, code, bits)
    _lib.check(managed, lambda m: not m)
    return Buffer(managed)
