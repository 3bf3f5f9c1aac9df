#!/usr/bin/env python3
"""torch.from_dlpack on stowage tensors, on the CPU.

Usage: torch_dlpack.py PATH/libstowage_dlpack_probe.so

The probe library (tests/integration/dlpack_probe.cpp) makes tensors with stowage's allocator on
an emulated device, whose memory is host memory, and exports them with stowage::to_dlpack.
Checked here, with PyTorch as the independent consumer:
  - values, shape and strides of a non-contiguous f32 view arrive unchanged, without a copy
    (PyTorch's data pointer is stowage's);
  - the bytes stay valid after every stowage view is gone, and the block goes back to stowage's
    allocator when PyTorch drops the tensor (the DLPack deleter ran, once);
  - the bf16 plane of split-storage weights is bit-identical to PyTorch's own fp32 -> bf16
    conversion (round-to-nearest-even) in nearest_even mode, and to (bits + 0x8000) >> 16 in
    half_up mode.
Exits 77 (ctest: skipped) where PyTorch is not installed (Debian: python3-torch).
"""
import ctypes
import gc
import sys

try:
    import torch
    import torch.utils.dlpack
except ImportError:
    print("SKIPPED: PyTorch is not installed (Debian: apt-get install python3-torch)")
    sys.exit(77)

failures = []


def check(condition, what):
    print(("ok    " if condition else "FAIL  ") + what)
    if not condition:
        failures.append(what)


lib = ctypes.CDLL(sys.argv[1])  # RTLD_LOCAL, as Python loads extension libraries
lib.probe_iota_f32.restype = ctypes.c_void_p
lib.probe_iota_f32.argtypes = [ctypes.c_int64] * 4 + [ctypes.POINTER(ctypes.c_void_p)]
lib.probe_bf16_weights.restype = ctypes.c_void_p
lib.probe_bf16_weights.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
lib.probe_allocated_bytes.restype = ctypes.c_int64
lib.probe_last_error.restype = ctypes.c_char_p

capsule_new = ctypes.pythonapi.PyCapsule_New
capsule_new.restype = ctypes.py_object
capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def from_probe(managed):
    if not managed:
        raise RuntimeError("probe failed: " + lib.probe_last_error().decode())
    # The DLPack capsule protocol: name "dltensor"; the consumer renames it and owns the tensor.
    return torch.utils.dlpack.from_dlpack(capsule_new(managed, b"dltensor", None))


print(f"PyTorch {torch.__version__}")
base = lib.probe_allocated_bytes()

# A non-contiguous f32 view: columns 2..6 of a 6 x 9 tensor.
rows, cols, c0, c1 = 6, 9, 2, 7
data = ctypes.c_void_p()
t = from_probe(lib.probe_iota_f32(rows, cols, c0, c1, ctypes.byref(data)))
expected = (torch.arange(rows * cols, dtype=torch.float32) * 0.25 - 3.0).reshape(rows, cols)[:, c0:c1]
check(t.device.type == "cpu", f"device is cpu (got {t.device})")
check(t.dtype == torch.float32, f"dtype float32 (got {t.dtype})")
check(tuple(t.shape) == (rows, c1 - c0), f"shape {(rows, c1 - c0)} (got {tuple(t.shape)})")
check(t.stride() == (cols, 1), f"strides {(cols, 1)} (got {t.stride()})")
check(t.data_ptr() == data.value, "no copy: PyTorch's data pointer is stowage's")
check(torch.equal(t, expected), "every value arrived (the probe's own views are gone by now)")
held = lib.probe_allocated_bytes()
check(held >= base + rows * cols * 4, f"the block stays allocated while PyTorch holds it ({held - base} B)")
t[0, 0] = 42.0  # written through PyTorch, read back through the same bytes
check(ctypes.c_float.from_address(data.value).value == 42.0, "a write through PyTorch lands in stowage's bytes")
del t
gc.collect()
check(lib.probe_allocated_bytes() == base, "dropping the PyTorch tensor gives the block back (deleter ran)")

# Split-storage bf16 planes against PyTorch's conversion.
g = torch.Generator().manual_seed(7)
normal = torch.randn(1 << 16, generator=g) * torch.logspace(-30, 30, 1 << 16)
patterns = torch.randint(-(1 << 31), 1 << 31, (1 << 16,), generator=g, dtype=torch.int64).to(torch.int32)
ties = (torch.randint(0, 1 << 16, (4096,), generator=g, dtype=torch.int64) << 16 | 0x8000).to(torch.int32)
specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-45, -1e-45, 1.17549435e-38,
                         3.4028235e38, -3.4028235e38], dtype=torch.float32)
values = torch.cat([normal, patterns.view(torch.float32), ties.view(torch.float32), specials])
values = values[~torch.isnan(values)].contiguous()  # NaN payloads: docs/precision.md
n = values.numel()
for nearest_even in (1, 0):
    w = from_probe(lib.probe_bf16_weights(values.data_ptr(), n, nearest_even))
    bits = w.view(torch.int16).to(torch.int64) & 0xFFFF
    if nearest_even:
        want = values.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
        what = "PyTorch's round-to-nearest-even"
    else:
        want = ((values.view(torch.int32).to(torch.int64) & 0xFFFFFFFF) + 0x8000 >> 16) & 0xFFFF
        what = "(bits + 0x8000) >> 16"
    mode = "nearest_even" if nearest_even else "half_up"
    check(w.dtype == torch.bfloat16 and tuple(w.shape) == (n,), f"{mode}: a bf16 tensor of {n} elements")
    differ = int((bits != want).sum())
    check(differ == 0, f"{mode}: bf16 plane equals {what} for all {n} values ({differ} differ)")
    del w
gc.collect()
check(lib.probe_allocated_bytes() == base, "every block is back with stowage at the end")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all checks passed")
