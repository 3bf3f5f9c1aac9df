"""Tensors in stowage's memory reach PyTorch through DLPack without a copy, and come back to
stowage when the last user lets go."""
import ctypes
import gc

import pytest

import stowage

torch = pytest.importorskip("torch")  # Debian's python3-torch; scripts/install-deps.sh installs it
from torch.utils.dlpack import from_dlpack  # noqa: E402

host_memory = pytest.mark.skipif(stowage.using_cuda(), reason="reads device memory from the host")


@host_memory
def test_zero_copy_both_ways():
    gc.collect()
    before = stowage.memory_allocated()
    buf = stowage.empty((4, 256), "float32")
    ptr = buf.data_ptr
    t = from_dlpack(buf)
    assert t.data_ptr() == ptr and t.shape == (4, 256) and t.dtype == torch.float32
    assert stowage.memory_allocated() == before + 4096
    t.fill_(2.5)
    raw = (ctypes.c_float * 1024).from_address(ptr)  # what torch wrote is in stowage's block
    assert raw[0] == 2.5 and raw[1023] == 2.5
    raw[7] = -1.0  # and what is written there torch sees
    assert t.view(-1)[7].item() == -1.0
    view = t[1:3]
    del t, buf
    gc.collect()
    assert stowage.memory_allocated() == before + 4096  # a view still holds the storage
    del view
    gc.collect()
    assert stowage.memory_allocated() == before


def torch_version():
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in torch.__version__.split(".")[:2])


# DLPack's bool (code 6) is newer than torch 2.0's reader (pytorch/pytorch#108486, 2023-09).
BOOL = pytest.param("bool", torch.bool, marks=pytest.mark.skipif(torch_version() < (2, 2),
                                                                 reason="torch<2.2 may lack kDLBool"))


@pytest.mark.parametrize("name,dtype", [("bfloat16", torch.bfloat16), ("float16", torch.float16),
                                        ("int64", torch.int64), ("uint8", torch.uint8), BOOL])
def test_dtypes_map(name, dtype):
    t = from_dlpack(stowage.empty((2, 3), name))
    assert t.dtype == dtype and t.shape == (2, 3)
    assert stowage.empty(5, dtype).shape == (5,)  # a torch.dtype names the type too


def test_unexported_and_unconsumed_memory_goes_back():
    gc.collect()
    before = stowage.memory_allocated()
    buf = stowage.empty((1024,), "int32")
    assert stowage.memory_allocated() == before + 4096
    del buf  # never exported
    gc.collect()
    assert stowage.memory_allocated() == before
    capsule = stowage.empty((1024,), "int32").__dlpack__()
    assert stowage.memory_allocated() == before + 4096
    del capsule  # exported, never consumed
    gc.collect()
    assert stowage.memory_allocated() == before


def test_a_buffer_exports_once():
    buf = stowage.empty((8,), "float32")
    t = from_dlpack(buf)
    with pytest.raises(stowage.InvalidArgumentError, match="already exported"):
        buf.__dlpack__()
    del t


def test_tensors_carry_their_tag():
    with stowage.tag("kv_cache"):
        t = from_dlpack(stowage.empty((3, 1000), "float32"))
    blocks = [b for s in stowage.snapshot()["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert [b["tag"] for b in blocks if b["requested_size"] == 12000] == ["kv_cache"]
    del t


def test_pinned_host_pool_tensors_are_zero_copy_cpu_tensors_given_back_with_the_last_view():
    gc.collect()
    before = stowage.host_stats()
    buf = stowage.host_empty((3, 100), "bfloat16")
    ptr = buf.data_ptr
    t = from_dlpack(buf)
    assert t.device.type == "cpu" and t.data_ptr() == ptr and t.shape == (3, 100) and t.dtype == torch.bfloat16
    live = stowage.host_stats()
    assert live["live_buffers"] == before["live_buffers"] + 1
    assert live["requested_bytes"] == before["requested_bytes"] + 600
    t.fill_(1.5)
    raw = (ctypes.c_uint16 * 300).from_address(ptr)  # bf16 1.5 is 0x3fc0, in the pool's buffer
    assert raw[0] == 0x3FC0 and raw[299] == 0x3FC0
    row = t[2]
    del t, buf
    gc.collect()
    assert stowage.host_stats()["live_buffers"] == before["live_buffers"] + 1  # the row holds it
    del row
    gc.collect()
    after = stowage.host_stats()
    assert after["live_buffers"] == before["live_buffers"] and after["requested_bytes"] == before["requested_bytes"]
    released = stowage.host_release_unused()  # the pages no buffer uses are unpinned
    assert 0 <= released <= after["pinned_bytes"]
    assert stowage.host_stats()["pinned_bytes"] == after["pinned_bytes"] - released


def test_host_pool_refuses_bad_input():
    with pytest.raises(stowage.InvalidArgumentError, match="host_empty: shape"):
        stowage.host_empty((2, -1))
    with pytest.raises(stowage.InvalidArgumentError, match="host_empty: dtype"):
        stowage.host_empty(4, "complex64")
    with pytest.raises(stowage.InvalidArgumentError, match="overflows"):
        stowage.host_empty((1 << 40, 1 << 40))
    with pytest.raises(stowage.InvalidArgumentError):
        stowage.host_empty(4, device=stowage.device_count())


@host_memory
def test_a_consumer_that_refuses_the_capsule_gets_its_own_error_and_the_memory_goes_back():
    """numpy (no bfloat16) drops the capsule with its exception pending: a capsule destructor written
    in Python could not run then (SystemError, and the block stayed taken); libstowage's C one can."""
    np = pytest.importorskip("numpy")
    if hasattr(np, "bfloat16"):
        pytest.skip("this numpy takes bfloat16")
    gc.collect()
    before, pool_before = stowage.memory_allocated(), stowage.host_stats()["live_buffers"]
    np.from_dlpack(stowage.empty((2, 3), "float32"))  # one taken, as before the refusals
    for make in (stowage.empty, stowage.host_empty):
        for _ in range(3):
            with pytest.raises(Exception) as refusal:
                np.from_dlpack(make((1024,), "bfloat16"))
            assert not isinstance(refusal.value, SystemError), refusal.value
    gc.collect()
    assert stowage.memory_allocated() == before
    assert stowage.host_stats()["live_buffers"] == pool_before
