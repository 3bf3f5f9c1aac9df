"""stowage.torch.swap on the CPU: what attention saves for backward leaves PyTorch's memory for
stowage's (the host side) after forward and comes back, prefetched, in backward; the losses and
gradients stay bit-identical. On a GPU the same code copies on side streams into pinned memory."""
import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage import InvalidArgumentError  # noqa: E402
from stowage.torch import demo, gpt  # noqa: E402
from stowage.torch.swap import SwapStats, swap_activations  # noqa: E402

LAYERS = 3


def model_and_data(steps):
    data, vocab = gpt.batches(gpt.corpus(), 32, 4, steps)
    torch.manual_seed(0)
    return gpt.GPT(vocab, 32, layers=LAYERS).to(torch.bfloat16), data, vocab


def train(model, data, vocab):
    losses = []
    for x, y in data:
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).float().view(-1, vocab), y.view(-1))
        loss.backward()
        losses.append(loss.item())
    return losses, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_losses_and_gradients_are_bit_identical_and_prefetch_runs_ahead(prefetch):
    model, data, vocab = model_and_data(3)
    base_losses, base_grads = train(model, data, vocab)
    model, data, vocab = model_and_data(3)
    handle = swap_activations(model, prefetch=prefetch)
    losses, grads = train(model, data, vocab)
    assert losses == base_losses
    assert all(torch.equal(a, b) for a, b in zip(grads, base_grads))
    s = handle.stats  # all three steps
    assert handle.modules == [f"blocks.{i}.attn" for i in range(LAYERS)]
    assert s.swapped > 0 and s.swapped % (3 * LAYERS) == 0
    per_call = s.swapped // (3 * LAYERS)
    assert s.bytes_to_host == s.bytes_to_device > 0
    # Backward reaches the last attention first: its tensors come back on demand; with a prefetch
    # distance, every earlier call's were already on their way.
    assert s.on_demand == (3 * per_call if prefetch else s.swapped)
    assert s.prefetched == s.swapped - s.on_demand
    # On the CPU every copy runs inline on the compute thread: all of it is waited for.
    assert s.d2h_ms > 0 and s.h2d_ms > 0 and s.compute_wait_ms == s.d2h_ms + s.h2d_ms
    assert s.overlap_fraction == 0.0
    s.reset()
    assert (s.bytes_to_host, s.swapped, s.d2h_ms, s.h2d_ms, s.compute_wait_ms) == (0, 0, 0.0, 0.0, 0.0)
    assert s.overlap_fraction == 1.0  # nothing copied: nothing exposed
    handle.remove()
    assert "forward" not in model.blocks[0].attn.__dict__


def test_parameters_given_new_storage_after_wrapping_are_still_not_swapped():
    """An optimizer made after swap_activations (mixed precision's bf16 copy, shared-storage planes)
    gives the parameters new storage: they are still recognised, and swap exactly what a model
    converted before wrapping swaps."""
    counts = []
    for convert_first in (True, False):
        model, data, vocab = model_and_data(2)
        model = model.float()
        if convert_first:
            for p in model.parameters():
                p.data = p.detach().to(torch.bfloat16)
        handle = swap_activations(model, prefetch=1, names=[f"blocks.{i}.attn.proj" for i in range(LAYERS)])
        if not convert_first:
            for p in model.parameters():
                p.data = p.detach().to(torch.bfloat16)
        train(model, data, vocab)
        counts.append((handle.stats.swapped, handle.stats.bytes_to_host, handle.stats.on_demand))
        handle.remove()
    assert counts[0] == counts[1]
    assert counts[0][0] == 2 * LAYERS  # each projection's input, never its weight


def saved_bytes(model, x):
    meter = demo.SavedBytes(model.parameters())
    with meter.hooks():
        out = model(x)
    return meter.bytes(), out


@pytest.mark.skipif(stowage.using_cuda(), reason="the CPU stand-in for host memory is stowage's own only where "
                    "libstowage runs the emulated device (under CUDA, CPU tensors swap to plain CPU memory)")
def test_the_swapped_tensors_live_in_stowages_memory_until_backward_lets_them_go():
    model, data, vocab = model_and_data(1)
    x, y = data[0]
    saved_before, _ = saved_bytes(model, x)
    handle = swap_activations(model)
    held = stowage.memory_allocated(0)
    saved_after, out = saved_bytes(model, x)
    moved = handle.stats.bytes_to_host
    # Autograd keeps fewer bytes in PyTorch's memory; the copies sit in stowage's (whole 512-byte
    # blocks each), and backward gives every one back.
    assert 0 < saved_before - saved_after <= moved
    assert stowage.memory_allocated(0) - held >= moved
    torch.nn.functional.cross_entropy(out.float().view(-1, vocab), y.view(-1)).backward()
    del out
    assert stowage.memory_allocated(0) == held
    assert handle.stats.bytes_to_device == moved
    handle.remove()
    assert saved_bytes(model, x)[0] == saved_before


def test_two_forwards_before_one_backward_keep_their_prefetches_apart():
    model, data, vocab = model_and_data(2)
    (a, ya), (b, yb) = data
    base = model_and_data(2)[0]
    loss = sum(torch.nn.functional.cross_entropy(base(x).float().view(-1, vocab), y.view(-1)) for x, y in data)
    loss.backward()
    handle = swap_activations(model, prefetch=1)
    loss = sum(torch.nn.functional.cross_entropy(model(x).float().view(-1, vocab), y.view(-1)) for x, y in data)
    loss.backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), base.parameters()))
    s = handle.stats
    per_call = s.swapped // (2 * LAYERS)
    assert s.bytes_to_device == s.bytes_to_host  # each tensor came back once
    assert s.on_demand == 2 * per_call  # each forward's last attention call; the rest prefetched
    assert s.prefetched == s.swapped - s.on_demand


def test_bad_arguments_are_refused():
    model, _, _ = model_and_data(1)
    with pytest.raises(InvalidArgumentError, match="prefetch"):
        swap_activations(model, prefetch=-1)
    with pytest.raises(InvalidArgumentError, match="no module named blocks.9"):
        swap_activations(model, names=["blocks.9"])
    with pytest.raises(InvalidArgumentError, match="no module was chosen"):
        swap_activations(torch.nn.Linear(2, 2))


class FakeEvent:
    """A CUDA event's timing surface: done or not, at a time in ms."""

    def __init__(self, at, done=True):
        self.at, self.done = at, done

    def query(self):
        return self.done

    def synchronize(self):
        self.done = True

    def elapsed_time(self, end):
        assert self.done and end.done, "elapsed_time of an event not yet done"
        return end.at - self.at


def test_timings_of_finished_copies_are_read_as_they_come_so_a_long_run_keeps_few_events():
    stats = SwapStats()
    for step in range(1000):
        stats._time("d2h", FakeEvent(0.0), FakeEvent(2.0))
        stats._time("h2d", FakeEvent(0.0), FakeEvent(1.0))
        stats._time("wait", FakeEvent(5.0), FakeEvent(4.0))  # the copy back was there first: no wait
    assert len(stats._timed) == 0  # nothing held: each pair was done when the next came
    # One still in flight holds the ones after it (read in order), and reading the stats waits for it.
    late = FakeEvent(3.0, done=False)
    stats._time("h2d", FakeEvent(0.0), late)
    stats._time("wait", FakeEvent(1.0), FakeEvent(1.5))
    assert len(stats._timed) == 2
    assert stats.d2h_ms == 2000.0 and stats.h2d_ms == 1003.0 and stats.compute_wait_ms == 0.5
    assert len(stats._timed) == 0 and late.done


@pytest.mark.skipif(not torch.cuda.is_available() or not stowage.using_cuda(),
                    reason="needs a CUDA GPU and a libstowage that uses it")
def test_on_cuda_the_copies_run_on_side_streams_and_report_what_compute_hid():
    model, data, vocab = model_and_data(3)
    model = model.cuda()
    data = [(x.cuda(), y.cuda()) for x, y in data]
    handle = swap_activations(model, prefetch=1)
    losses, _ = train(model, data, vocab)
    s = handle.stats
    assert s.bytes_to_host == s.bytes_to_device > 0 and all(loss == loss for loss in losses)
    # Timed by events on the copy streams: every copy took some time, compute waited at most for
    # all of it plus the queue ahead of it, and the fraction hidden is a fraction.
    assert s.d2h_ms > 0 and s.h2d_ms > 0 and s.compute_wait_ms >= 0 and 0.0 <= s.overlap_fraction <= 1.0
    assert s.overlap_fraction == max(0.0, 1.0 - s.compute_wait_ms / (s.d2h_ms + s.h2d_ms))
    handle.remove()
