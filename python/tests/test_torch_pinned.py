"""Host memory for CUDA tensors (swap's copies, offloaded optimizer state) comes from stowage's
pinned host pool; what copies still use is held until their events are done."""
import gc
import warnings
import weakref

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage.torch import _pinned  # noqa: E402
from stowage.torch._pinned import Holds, pinned_empty, pool_tensor  # noqa: E402


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


@pytest.mark.skipif(stowage.using_cuda(), reason="reads the pool's memory from the host as an emulated device's")
def test_prune_lets_go_of_finished_holds_so_the_next_buffer_reuses_their_pages():
    holds = Holds()
    gc.collect()
    pending = FakeEvent()
    kept = pool_tensor((1 << 20,), torch.uint8, 0)
    holds.hold(pending, kept)
    done = FakeEvent()
    holds.hold(done, pool_tensor((1 << 20,), torch.uint8, 0))
    done.done = True
    del kept
    holds.prune()  # the first is not done: nothing behind it goes either, in order
    assert len(holds) == 2
    pending.done = True
    holds.prune()
    gc.collect()
    assert len(holds) == 0
    before = stowage.host_stats()
    again = [pool_tensor((1 << 20,), torch.uint8, 0) for _ in range(2)]
    after = stowage.host_stats()
    assert after["num_maps"] == before["num_maps"] and after["live_buffers"] == before["live_buffers"] + 2
    del again


@pytest.mark.skipif(stowage.using_cuda(), reason="libstowage uses CUDA here")
def test_without_a_cuda_libstowage_a_cuda_tensors_host_copy_is_pytorchs_pinned_memory_said_once(monkeypatch):
    asked = []
    monkeypatch.setattr(_pinned, "_warned", [])
    monkeypatch.setattr(torch, "empty", lambda shape, dtype, pin_memory: asked.append((shape, dtype, pin_memory)))
    with pytest.warns(RuntimeWarning, match="is not using CUDA.*PyTorch's pinned memory"):
        pinned_empty((2, 2), torch.float32, torch.device("cuda", 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pinned_empty((3,), torch.bfloat16, torch.device("cuda", 0))
    assert asked == [((2, 2), torch.float32, True), ((3,), torch.bfloat16, True)]


@pytest.mark.skipif(stowage.using_cuda(), reason="reads the pool's memory from the host as an emulated device's")
@pytest.mark.parametrize("shape,dtype", [((4, 3), torch.complex64), ((5,), torch.bool), ((), torch.float64),
                                         ((0, 7), torch.bfloat16)])
def test_pool_tensors_take_any_dtype_as_the_pools_bytes(shape, dtype):
    gc.collect()
    before = stowage.host_stats()
    t = pool_tensor(shape, dtype, 0)
    nbytes = t.numel() * t.element_size()
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
    assert stowage.host_stats()["requested_bytes"] == before["requested_bytes"] + nbytes
    t.fill_(1)
    assert bool((t == 1).all())
    del t
    gc.collect()
    assert stowage.host_stats()["requested_bytes"] == before["requested_bytes"]


def test_an_optimizer_with_offloaded_state_waits_for_its_steps_before_the_state_goes(monkeypatch):
    from optim_training import batches, make_model, train
    from stowage.torch.offload import StateHomes
    from stowage.torch.optim import SharedStorageAdamW
    seen = []
    monkeypatch.setattr(StateHomes, "synchronize", lambda self: seen.append(alive() is not None))
    model = make_model()
    opt = SharedStorageAdamW(model.parameters(), state_offload="mapped")
    train(model, opt, batches(1))
    state = weakref.ref(opt.state[next(iter(model.parameters()))]["exp_avg"])
    alive = state  # called by the stand-in synchronize: is the state still there?
    del opt
    gc.collect()
    assert seen == [True] and state() is None  # waited for once, while the state was still there


@pytest.mark.skipif(not torch.cuda.is_available() or not stowage.using_cuda(),
                    reason="needs a CUDA GPU and a libstowage that uses it")
def test_on_cuda_pinned_tensors_are_pool_memory_that_copies_reach_asynchronously():
    gc.collect()
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


def test_a_cuda_device_without_an_index_is_the_current_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert _pinned.cuda_index(torch.device("cuda", 3)) == 3
    assert _pinned.cuda_index(torch.device("cuda")) == 2  # as torch places "cuda", not device 0
