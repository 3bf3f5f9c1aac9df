"""stowage.torch, the drop-in. On a machine without CUDA only its refusals are tested; the GPU
tests (test_torch_gpu.py) run where PyTorch sees a GPU."""
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


def test_the_shim_source_and_header_ship_with_the_package():
    import os
    src = st.shim_source()
    assert os.path.isfile(src)
    header = os.path.join(os.path.dirname(src), "stowage.h")
    with open(header) as f:
        text = f.read()
    for fn in ("stowage_record_stream", "stowage_set_memory_fraction", "stowage_last_error_code"):
        assert fn in text
