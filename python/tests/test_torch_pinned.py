"""Host memory for CUDA tensors (swap's copies, offloaded optimizer state) comes from stowage's
pinned host pool; what copies still use is held until their events are done."""
import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage.torch._pinned import Holds, pinned_empty  # noqa: E402


class FakeEvent:
    def __init__(self, done=False):
        self.done = done

    def query(self):
        return self.done


def test_a_held_tensor_lives_until_its_event_and_those_after_it_are_let_go_in_order():
    holds = Holds()
    first, second = FakeEvent(), FakeEvent(done=True)
    a, b = torch.empty(4), torch.empty(4)
    gone_a, gone_b = weakref.ref(a), weakref.ref(b)
    holds.hold(first, a)
    holds.hold(second, b)  # done, but behind one that is not
    del a, b
    gc.collect()
    assert len(holds) == 2 and gone_a() is not None and gone_b() is not None
    first.done = True
    holds.hold(FakeEvent(done=True), torch.empty(1))  # the next hold lets both go, and itself
    gc.collect()
    assert len(holds) == 0 and gone_a() is None and gone_b() is None


@pytest.mark.skipif(stowage.using_cuda(), reason="libstowage uses CUDA here")
def test_without_a_cuda_libstowage_a_cuda_tensors_host_memory_is_refused_by_name():
    with pytest.raises(stowage.StowageError, match="pinned host pool.*is not using CUDA"):
        pinned_empty((2, 2), torch.float32, torch.device("cuda", 0))


@pytest.mark.skipif(not torch.cuda.is_available() or not stowage.using_cuda(),
                    reason="needs a CUDA GPU and a libstowage that uses it")
def test_on_cuda_pinned_tensors_are_pool_memory_that_copies_reach_asynchronously():
    before = stowage.host_stats(0)
    host = pinned_empty((1024, 1024), torch.float32, torch.device("cuda", 0))
    assert host.device.type == "cpu" and host.is_pinned()
    assert stowage.host_stats(0)["requested_bytes"] == before["requested_bytes"] + (4 << 20)
    dev = torch.arange(1 << 20, dtype=torch.float32, device="cuda").view(1024, 1024)
    host.copy_(dev, non_blocking=True)
    back = host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(back, dev) and host[1023, 1023].item() == float((1 << 20) - 1)
    flag = pinned_empty((3,), torch.bool, torch.device("cuda", 0))
    assert flag.dtype == torch.bool and flag.shape == (3,)
    del host, flag
    gc.collect()
    assert stowage.host_stats(0)["requested_bytes"] == before["requested_bytes"]
