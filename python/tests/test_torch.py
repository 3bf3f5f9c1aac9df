"""stowage.torch, the drop-in. On a machine without CUDA only its refusals are tested; the GPU
tests (test_torch_gpu.py) run where PyTorch sees a GPU."""
import types

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
import stowage.torch as st  # noqa: E402


def version(v):
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in v.split("+")[0].split(".")[:2])


@pytest.mark.skipif(version(torch.__version__) >= (2, 0), reason="the refusal of a torch without the pluggable API")
def test_an_old_torch_is_refused_by_name():
    with pytest.raises(stowage.StowageError, match=r"needs PyTorch 2\.0 or newer.*this is " + torch.__version__):
        st.enable()
    assert st.enabled() is None


@pytest.mark.skipif(version(torch.__version__) < (2, 0) or torch.cuda.is_available(), reason="needs torch>=2 without CUDA")
def test_no_cuda_is_refused_clearly():
    with pytest.raises(stowage.StowageError, match="sees no CUDA device"):
        st.enable()


def test_readers_match_the_ctypes_layer():
    p = stowage.raw_alloc(1 << 20)
    assert st.memory_allocated(0) == stowage.memory_allocated(0)
    assert st.memory_stats(0) == stowage.memory_stats(0)
    stowage.raw_free(p, 1 << 20)


def test_readers_without_a_device_read_torchs_current_one_or_device_0_without_cuda():
    """As docs/pytorch.md shows them, with no device: a CPU-only torch has no current CUDA device
    (torch.cuda.current_device() raises AssertionError there), and stowage's devices are then
    emulated, read from device 0 as the package's own readers do."""
    want = torch.cuda.current_device() if torch.cuda.is_available() else 0
    p = stowage.raw_alloc(1 << 20, device=want)
    try:
        st.reset_peak_memory_stats()
        assert st.memory_stats() == stowage.memory_stats(want)
        assert st.memory_allocated() == stowage.memory_allocated(want) >= 1 << 20
        assert st.max_memory_allocated() == stowage.max_memory_allocated(want)
        assert st.memory_reserved() == stowage.memory_reserved(want)
        assert st.max_memory_reserved() == stowage.max_memory_reserved(want)
        assert st.snapshot()["device"] == want
    finally:
        stowage.raw_free(p, 1 << 20, device=want)


def test_the_shim_source_and_header_ship_with_the_package():
    import os
    src = st.shim_source()
    assert os.path.isfile(src)
    header = os.path.join(os.path.dirname(src), "stowage.h")
    with open(header) as f:
        text = f.read()
    for fn in ("stowage_record_stream", "stowage_set_memory_fraction", "stowage_last_error_code"):
        assert fn in text


FALLBACK = r"""
import types, warnings, torch, stowage.torch as st
from stowage import memory
# A PyTorch 2 with CUDA, as far as enable() can tell, whose compiler fails: the plain fallback.
torch.__version__ = "2.4.0"
torch.cuda.is_available = lambda: True
memory.using_cuda = lambda: True
def no_compiler(verbose=False):
    raise OSError("no C++ compiler\nsecond line")
st.build_shim = no_compiler
made, installed = [], []
class Plain:
    def __init__(self, path, alloc, free):
        made.append((path, alloc, free))
torch.cuda.memory = types.SimpleNamespace(CUDAPluggableAllocator=Plain, change_current_allocator=installed.append)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = st.enable()
    second = st.enable()
print(first, second, st.enabled(), len(made), len(installed), made[0][1:] == ("stowage_malloc", "stowage_free"))
print(len(caught), caught[0].category.__name__)
print(caught[0].message)
try:
    st._enabled = None
    st.enable(shim="required")
except Exception as e:
    print(type(e).__name__, e)
"""


def test_without_a_compiler_it_falls_back_to_the_plain_allocator_and_warns_once(python):
    r = python(FALLBACK)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "plain plain plain 1 1 True"  # one allocator made and installed; enable() is idempotent
    assert lines[1] == "1 RuntimeWarning"
    message = lines[2]
    assert "shim did not build (OSError: no C++ compiler)" in message
    for unsafe in ("record_stream() is not seen", "empty_cache()", "set_per_process_memory_fraction()",
                   "not torch.cuda.OutOfMemoryError"):
        assert unsafe in message, unsafe
    assert lines[3].startswith("StowageError stowage.torch.enable(): the shim did not build: no C++ compiler")


def test_the_shim_is_compiled_optimised_and_a_flag_change_is_a_new_build(monkeypatch, tmp_path):
    # cpp_extension.load compiles at -O0 unless given flags; the shim runs on every allocation.
    from torch.utils import cpp_extension
    calls = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: calls.append(kw) or kw["name"])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = st.build_shim()
    assert calls[0]["extra_cflags"] == ["-O2"]
    assert calls[0]["sources"] == [st.shim_source()]
    assert calls[0]["build_directory"].startswith(str(tmp_path / "stowage" / "torch-shim"))
    monkeypatch.setattr(st, "SHIM_CFLAGS", ["-O3"])
    second = st.build_shim()
    assert calls[1]["extra_cflags"] == ["-O3"]
    assert first != second and calls[0]["build_directory"] != calls[1]["build_directory"]


def test_a_device_without_an_index_is_torchs_current_one(monkeypatch):
    """memory_stats("cuda") reads the current device, as torch.cuda.memory_stats("cuda") does: a
    stand-in torch whose current device is 1."""
    class Device:
        def __init__(self, spec):
            kind, _, index = str(spec).partition(":")
            self.type, self.index = kind, int(index) if index else None

    fake = types.SimpleNamespace(device=Device, cuda=types.SimpleNamespace(is_available=lambda: True,
                                                                           current_device=lambda: 1))
    monkeypatch.setattr(st, "_torch", lambda: fake)
    assert st._device("cuda") == 1
    assert st._device("cuda:0") == 0
    assert st._device(None) == 1
    assert st._device(3) == 3
