"""stowage.torch.swap on the CPU: what attention saves for backward leaves PyTorch's memory for
stowage's (the host side) after forward and comes back, prefetched, in backward; the losses and
gradients stay bit-identical. On a GPU the same code copies on side streams into pinned memory."""
import copy
import inspect
import time

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage.torch._wrapping import storage_of  # noqa: E402
from stowage import InvalidArgumentError  # noqa: E402
from stowage.torch import demo, gpt  # noqa: E402
from stowage.torch.swap import SwapStats, swap_activations  # noqa: E402
from pickling import loaded_without_stowage  # noqa: E402

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
    began = time.perf_counter()
    losses, grads = train(model, data, vocab)
    wall_ms = 1e3 * (time.perf_counter() - began)
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
    # The hooks' host time holds those inline copies, within the steps' own time.
    assert s.d2h_ms + s.h2d_ms <= s.hook_ms < wall_ms
    s.reset()
    assert (s.bytes_to_host, s.swapped, s.d2h_ms, s.h2d_ms, s.compute_wait_ms, s.hook_ms) == (0, 0, 0.0, 0.0, 0.0,
                                                                                             0.0)
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


class KTransposedAttention(torch.nn.Module):
    """softmax(q kᵀ) v with 3-d tensors: the matmul saves kᵀ as the transposed view it is."""

    def __init__(self, hidden=16):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(hidden, hidden) for _ in range(3))

    def forward(self, x):
        return (self.q(x) @ self.k(x).transpose(-1, -2) / 4).softmax(-1) @ self.v(x)


def attention_grads(model, x, w):
    model.zero_grad()
    out = model(x)
    (out * w).sum().backward()
    return out, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("prefetch", [0, 1])
def test_a_transposed_saved_tensor_keeps_its_strides_so_bf16_gradients_stay_bit_identical(prefetch):
    """A contiguous copy of kᵀ would send bf16 backward down another matmul path, which rounds
    differently: the q projection's gradients differed when swap brought kᵀ back contiguous."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(KTransposedAttention(), KTransposedAttention()).to(torch.bfloat16)
    x = torch.randn(3, 7, 16, dtype=torch.bfloat16)
    w = torch.randn(3, 7, 16, dtype=torch.bfloat16)
    base_out, base_grads = attention_grads(model, x, w)
    handle = swap_activations(model, prefetch=prefetch)
    out, grads = attention_grads(model, x, w)
    assert handle.stats.swapped > 0
    assert torch.equal(out, base_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, base_grads))


class Saves(torch.autograd.Function):
    """Saves the given tensors for backward; backward records what autograd hands it."""
    seen = []

    @staticmethod
    def forward(ctx, x, *saved):
        ctx.save_for_backward(*saved)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        Saves.seen[:] = ctx.saved_tensors
        return (grad,) + (None,) * len(Saves.seen)


class SavesEveryLayout(torch.nn.Module):
    def layouts(self):
        g = torch.Generator().manual_seed(3)
        row = torch.randn(10, generator=g)

        def base():  # a storage of its own for each (views of one storage share one copy: below)
            return torch.randn(6, 10, generator=g)
        return {
            "transposed (dense, permuted)": base().t(),
            "every other column (gaps)": base()[:, ::2],
            "a column slice at an offset": base()[:, 2:5],
            "gaps, transposed": base()[:, ::2].t(),
            "expanded (stride 0)": row.expand(6, 10),
            "dense at an unaligned offset": base().view(-1)[3:43].view(4, 10),
            "bool, transposed": (base() > 0).t(),
            "complex": torch.complex(base()[:2], base()[2:4]),
            "empty": base()[:0],
        }

    def forward(self, x):
        self.saved = self.layouts()
        return Saves.apply(x, *self.saved.values())


# What each layout comes back as: its own strides without gaps; with gaps, dense in its own order
# of dimensions (the innermost first), only its numel elements copied.
COMES_BACK = {
    "transposed (dense, permuted)": ((1, 10), 60),
    "every other column (gaps)": ((5, 1), 30),
    "a column slice at an offset": ((3, 1), 18),
    "gaps, transposed": ((1, 5), 30),
    "expanded (stride 0)": ((0, 1), 10),
    "dense at an unaligned offset": ((10, 1), 40),
    "bool, transposed": ((1, 10), 60),
    "complex": ((10, 1), 20),
    "empty": ((10, 1), 0),
}


@pytest.mark.parametrize("prefetch", [0, 1])
def test_every_saved_layout_comes_back_with_its_shape_strides_alignment_and_bits(prefetch):
    """Layouts without gaps keep their strides, their span copied (numel elements when dense,
    fewer for stride 0); ones with gaps come back dense in their own order of dimensions, numel
    elements copied, the gaps not."""
    model = torch.nn.Sequential(SavesEveryLayout())
    handle = swap_activations(model, prefetch=prefetch, names=["0"])
    x = torch.randn(4, requires_grad=True)
    model(x).sum().backward()
    saved = model[0].saved
    assert len(Saves.seen) == len(saved)
    for (name, before), after in zip(saved.items(), Saves.seen):
        if before.numel():  # a copy came back, not the tensor itself (an empty one has no address)
            assert after.data_ptr() != before.data_ptr(), name
        assert (after.shape, after.stride(), after.dtype) == (before.shape, COMES_BACK[name][0], before.dtype), name
        assert after.data_ptr() % 64 == before.data_ptr() % 64, name
        assert torch.equal(after, before), name
    s = handle.stats
    assert s.swapped == s.on_demand == len(saved) and s.prefetched == 0
    assert s.bytes_to_host == s.bytes_to_device == sum(
        COMES_BACK[name][1] * t.element_size() for name, t in saved.items())
    assert s.bytes_to_host == (60 + 30 + 18 + 30 + 10 + 40) * 4 + 60 + 20 * 8


def saved_by(model, *args):
    """The tensors that model(*args) saves for backward, parameters aside (nothing wrapped)."""
    params = {storage_of(p).data_ptr() for p in model.parameters()}
    saved = []

    def pack(t):
        if storage_of(t).data_ptr() not in params:
            saved.append(t)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*args)
    return saved


def distinct_bytes(saved):
    """The bytes swap moves each way for these saved tensors (no storage saved by two module calls):
    of each storage, the bytes that the saved tensors without gaps span, each once; a tensor with
    gaps whose span those do not cover, its own elements, once for each distinct view."""
    spans, gaps = {}, set()
    for t in saved:
        size = t.element_size()
        span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
        lo, ptr = t.storage_offset() * size, storage_of(t).data_ptr()
        if span <= t.numel():
            spans.setdefault(ptr, set()).update(range(lo, lo + span * size))
        else:
            gaps.add((ptr, lo, lo + span * size, tuple(t.shape), tuple(t.stride()), t.dtype, t.numel() * size))
    copied = sum(map(len, spans.values()))
    return copied + sum(g[-1] for g in gaps if not set(range(g[1], g[2])) <= spans.get(g[0], set()))


class FusedQkvAttention(torch.nn.Module):
    """GPT-2's layout: one qkv projection split into heads, so q, k and v are views with gaps."""

    def __init__(self, hidden=32, heads=4):
        super().__init__()
        self.qkv, self.heads = torch.nn.Linear(hidden, 3 * hidden), heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        att = (q @ k.transpose(-2, -1) / 4).softmax(-1)
        return (att @ v).transpose(1, 2).reshape(b, t, c)


@pytest.mark.parametrize("prefetch", [0, 1])
def test_views_with_gaps_of_a_fused_qkv_come_back_dense_with_bf16_gradients_bit_identical(prefetch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(FusedQkvAttention(), FusedQkvAttention()).to(torch.bfloat16)
    x = torch.randn(2, 9, 32, dtype=torch.bfloat16)
    w = torch.randn(2, 9, 32, dtype=torch.bfloat16)
    saved = saved_by(model, x)  # the model's own saves (attention_grads' loss saves too)
    base_out, base_grads = attention_grads(model, x, w)
    handle = swap_activations(model, prefetch=prefetch)
    out, grads = attention_grads(model, x, w)
    assert torch.equal(out, base_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, base_grads))
    # q, k and v each move their own elements, not the whole qkv they are views of.
    assert handle.stats.swapped == len(saved) and handle.stats.bytes_to_host == distinct_bytes(saved)


def test_a_deep_copy_of_a_swapped_model_is_a_plain_model_on_its_own_weights():
    """An EMA model is made by copy.deepcopy: it must compute with its own weights (not the
    original's), and swapping (stats, remove) stays with the original."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(KTransposedAttention(), torch.nn.Linear(16, 16))
    plain, reference = copy.deepcopy(model), copy.deepcopy(model)  # before wrapping
    handle = swap_activations(model, prefetch=1)
    ema = copy.deepcopy(model)
    with torch.no_grad():
        for p in ema.parameters():
            p.mul_(0.5)
        for p in reference.parameters():
            p.mul_(0.5)
    x, w = torch.randn(3, 7, 16), torch.randn(3, 7, 16)
    # The copy runs its own (halved) weights, unwrapped: the same numbers as a plain model, nothing swapped.
    out, grads = attention_grads(ema, x, w)
    ref_out, ref_grads = attention_grads(reference, x, w)
    assert torch.equal(out, ref_out) and all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    assert handle.stats.swapped == 0
    assert all(type(m).forward.__get__(m)(x[:1]).equal(m(x[:1])) for m in (ema[0], ema))
    # The original still swaps, on its own (unchanged) weights.
    model_out, model_grads = attention_grads(model, x, w)
    plain_out, plain_grads = attention_grads(plain, x, w)
    assert torch.equal(model_out, plain_out) and all(torch.equal(a, b) for a, b in zip(model_grads, plain_grads))
    assert handle.stats.swapped > 0 and handle.stats.bytes_to_device == handle.stats.bytes_to_host
    handle.remove()
    assert "forward" not in model.__dict__ and "forward" not in model[0].__dict__


def test_a_pickled_swapped_model_loads_as_a_plain_model_without_stowage():
    """torch.save(model) of a wrapped model works, and what loads is a plain model: no closure of
    the original's, nothing of stowage's needed to load it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(KTransposedAttention(), torch.nn.Linear(16, 16))
    handle = swap_activations(model)
    loaded = loaded_without_stowage(model)
    with torch.no_grad():
        for p in loaded.parameters():
            p.mul_(0.5)
    reference = torch.nn.Sequential(KTransposedAttention(), torch.nn.Linear(16, 16))
    reference.load_state_dict(loaded.state_dict())
    x, w = torch.randn(3, 7, 16), torch.randn(3, 7, 16)
    out, grads = attention_grads(loaded, x, w)
    ref_out, ref_grads = attention_grads(reference, x, w)
    assert torch.equal(out, ref_out) and all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    assert handle.stats.swapped == 0  # the loaded model swapped nothing; the original still does
    attention_grads(model, x, w)
    assert handle.stats.swapped > 0 and handle.stats.bytes_to_device == handle.stats.bytes_to_host


def test_a_refused_remove_changes_nothing():
    """remove() checks every restore before it undoes any: a refusal found at the handle's first
    module (after its model-level wrapper passed the check) leaves that wrapper in place."""
    from stowage.torch.recompute import recompute_activations
    torch.manual_seed(0)
    model = torch.nn.Sequential(KTransposedAttention(), torch.nn.Linear(16, 16), torch.nn.GELU(),
                                torch.nn.Linear(16, 16))
    recompute = recompute_activations(model)
    swap = swap_activations(model, names=["0"])
    inner = model[0].forward
    model[0].forward = lambda *a, **k: inner(*a, **k)  # someone else's wrapper, over swap's

    def state():
        return {name: (m.__dict__.get("forward"), dict(m._forward_pre_hooks), dict(m._forward_hooks))
                for name, m in model.named_modules()}

    before = state()
    for handle in (swap, recompute):  # recompute: swap's model wrapper is over its own
        with pytest.raises(InvalidArgumentError, match="reverse order"):
            handle.remove()
        assert state() == before
    # Both still work: swap's per-forward state and recompute's stats are still reset per forward.
    x = torch.randn(3, 7, 16, requires_grad=True)
    for _ in range(2):
        model(x).sum().backward()
    assert recompute.stats.activations_released == 1 and recompute.stats.recomputations == 2
    assert swap.stats.swapped > 0 and swap.stats.swapped % 2 == 0
    assert swap.stats.bytes_to_device == swap.stats.bytes_to_host > 0
    model[0].forward = inner
    swap.remove()
    recompute.remove()
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_the_models_forward_keeps_its_signature_for_code_that_reads_it():
    """Hugging Face's Trainer keeps the dataset columns named by inspect.signature(model.forward):
    a wrapped model must still name its own parameters."""
    from stowage.torch.recompute import recompute_activations

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.fc, self.act = KTransposedAttention(), torch.nn.Linear(16, 16), torch.nn.GELU()

        def forward(self, input_embeds, attention_mask=None, *, labels=None):
            return self.act(self.fc(self.attn(input_embeds)))

    model = Net()
    expected = inspect.signature(Net.forward.__get__(model))
    assert list(expected.parameters) == ["input_embeds", "attention_mask", "labels"]
    with recompute_activations(model), swap_activations(model):
        assert inspect.signature(model.forward) == expected
        assert inspect.signature(model.attn.forward) == inspect.signature(KTransposedAttention.forward.__get__(
            model.attn))
        ema = copy.deepcopy(model)  # a plain model, whose forward still names its parameters
        assert inspect.signature(ema.forward) == inspect.signature(Net.forward.__get__(ema))


class SeparateQkvAttention(torch.nn.Module):
    """q, k and v from Linears of their own (Hugging Face's BERT, Llama): each saves the input x;
    softmax saves its output, and the matmul after it a view of the same storage. With `gain` (a
    parameter of the model's, not the module's), its product with x is what q, k and v read."""

    def __init__(self, hidden=32, heads=4):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(hidden, hidden) for _ in range(4))
        self.heads = heads

    def forward(self, x, gain=None):
        if gain is not None:
            x = x * gain  # saves x and the model's parameter
        b, s, h = x.shape
        q, k, v = (z.view(b, s, self.heads, h // self.heads).transpose(1, 2) for z in (self.q(x), self.k(x), self.v(x)))
        a = (q @ k.transpose(-1, -2) / 4).softmax(-1)
        return self.o((a @ v).transpose(1, 2).reshape(b, s, h))


def separate_qkv_saves():
    """What one SeparateQkvAttention call on a (2, 5, 32) bf16 x saves, parameters aside: x (640
    bytes) three times, q and kᵀ as the matmul's copies (640 each), softmax's output (400) and the
    matmul's view of it, v's copy and o's input (640 each): 9 tensors, 5,280 bytes, over 6 storages
    of 3,600 bytes. torch before 2 also saves the divisor as a 0-dim 64-bit tensor (8 bytes, a
    storage of its own); later versions keep the Python number. Returns (tensors, bytes, distinct
    bytes), measured, after checking they are one of the two."""
    torch.manual_seed(0)
    saved = saved_by(SeparateQkvAttention().to(torch.bfloat16), torch.randn(2, 5, 32, dtype=torch.bfloat16))
    divisor = [t for t in saved if t.dim() == 0]
    assert len(divisor) <= 1 and all(t.element_size() == 8 for t in divisor)
    got = (len(saved), sum(t.numel() * t.element_size() for t in saved), distinct_bytes(saved))
    assert got == (9 + len(divisor), 5280 + 8 * len(divisor), 3600 + 8 * len(divisor))
    return got


@pytest.mark.parametrize("prefetch", [0, 1])
def test_a_storage_that_several_ops_save_is_copied_once_each_way(prefetch):
    """x goes to host once for the q, k and v projections that all save it, softmax's output once for
    softmax and the matmul's view of it, and each comes back as one device copy that every saved
    tensor of it is a view of: the bytes moved are the distinct bytes, the gradients bit-identical."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(SeparateQkvAttention(), SeparateQkvAttention()).to(torch.bfloat16)
    x = torch.randn(2, 5, 32, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    h, calls = x, []
    for layer in model:
        calls.append(saved_by(layer, h))
        h = layer(h)
    saves, _, distinct = separate_qkv_saves()
    assert [(len(c), sum(t.numel() * t.element_size() for t in c), distinct_bytes(c)) for c in calls] == \
        [separate_qkv_saves()] * 2
    base_out, base_grads = attention_grads(model, x, w)
    base_x = x.grad.clone()
    x.grad = None
    handle = swap_activations(model, prefetch=prefetch)
    out, grads = attention_grads(model, x, w)
    assert torch.equal(out, base_out) and torch.equal(x.grad, base_x)
    assert all(torch.equal(a, b) for a, b in zip(grads, base_grads))
    s = handle.stats
    assert s.swapped == 2 * saves  # saved tensors, those sharing another's copy included
    assert s.bytes_to_host == s.bytes_to_device == 2 * distinct  # each storage's bytes once, not each tensor's
    assert s.on_demand == (saves if prefetch else s.swapped) and s.prefetched == s.swapped - s.on_demand


class SavesViewsOfFewStorages(torch.nn.Module):
    def layouts(self):
        g = torch.Generator().manual_seed(5)
        base, other = torch.randn(6, 10, generator=g), torch.randn(60, generator=g)
        third = torch.randn(6, 10, generator=g)
        return {
            # base: its whole span first, then views inside it (one with gaps), another dtype's
            "base, transposed": (base.t(), "base"),
            "base again": (base, "base"),
            "rows 1 and 2": (base[1:3], "base"),
            "every other column, inside what is copied": (base[:, ::2], "base"),
            "base's bytes as int32": (base.view(torch.int32)[2:4], "base"),
            # other: two ranges that overlap, the second copying only what the first did not
            "first half": (other[:30], "other"),
            "overlapping it": (other[20:50].view(5, 6), "other"),
            # third: a view with gaps saved before anything covers it is copied on its own
            "gaps, before its storage": (third[:, ::2], None),
            "third": (third, "third"),
        }

    def forward(self, x):
        self.saved = self.layouts()
        return Saves.apply(x, *(t for t, _ in self.saved.values()))


@pytest.mark.parametrize("prefetch", [0, 1])
def test_views_of_one_storage_come_back_as_views_of_one_device_copy(prefetch):
    """Each saved view keeps its own offset, shape, strides and dtype over the copy back of the
    storage's bytes, at the saved data pointer's alignment; overlapping ranges move once."""
    model = torch.nn.Sequential(SavesViewsOfFewStorages())
    handle = swap_activations(model, prefetch=prefetch, names=["0"])
    x = torch.randn(4, requires_grad=True)
    model(x).sum().backward()
    saved = model[0].saved
    assert len(Saves.seen) == len(saved)
    copies = {}
    for (name, (before, group)), after in zip(saved.items(), Saves.seen):
        assert after.data_ptr() != before.data_ptr(), name
        stride = before.stride() if group is not None else (5, 1)  # dense, as a view with gaps alone
        assert (after.shape, after.stride(), after.dtype) == (before.shape, stride, before.dtype), name
        assert after.data_ptr() % 64 == before.data_ptr() % 64, name
        assert torch.equal(after, before), name
        if group is not None:
            # where it lies in the copy back of its storage's bytes: where it lay in the storage
            copies.setdefault(group, set()).add(after.data_ptr() - before.data_ptr() + storage_of(before).data_ptr())
    assert {group: len(starts) for group, starts in copies.items()} == {"base": 1, "other": 1, "third": 1}
    assert len({storage_of(Saves.seen[i]).data_ptr() for i in range(7)}) == 2  # base's and other's
    s = handle.stats
    assert s.swapped == s.on_demand == len(saved) and s.prefetched == 0
    # base whole (60 floats), other's first 50 floats (30, then the 20 the second range adds), third's
    # view with gaps dense (30 floats) and then third whole (60): 200 floats, not the 367 saved.
    assert s.bytes_to_host == s.bytes_to_device == (60 + 50 + 30 + 60) * 4
    handle.remove()


class GainedNet(torch.nn.Module):
    """An embedding, attention layers that read a parameter of the model's, a head: a loop may call
    model(idx) or model.head(...layers(model.emb(idx))) itself."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(50, 32), torch.nn.Linear(32, 50)
        self.gain = torch.nn.Parameter(torch.ones(32))
        self.layers = torch.nn.ModuleList([SeparateQkvAttention(), SeparateQkvAttention()])

    def forward(self, idx):
        return self.head(self.submodules(idx))

    def submodules(self, idx):
        x = self.emb(idx)
        for layer in self.layers:
            x = layer(x, self.gain)
        return x


@pytest.mark.parametrize("call", ["model", "submodules"])
def test_a_loop_that_calls_submodules_swaps_what_one_that_calls_the_model_does(call):
    """The parameters get new storage after wrapping (apply()'s shared-storage planes): a loop that
    never calls the model must still leave them on the device, its own module's and the model's
    alike, and keep no state of the steps that backward has finished."""
    from stowage.torch import swap as swap_module
    idx = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(1))

    def made(wrap):
        torch.manual_seed(0)
        model = GainedNet()
        handle = swap_activations(model, prefetch=1) if wrap else None
        for p in model.parameters():
            p.data = p.detach().to(torch.bfloat16)  # new storage; the old is freed for activations to reuse
        return model, handle

    def step(model):
        model.zero_grad()
        out = model(idx) if call == "model" else model.head(model.submodules(idx))
        (out.float() ** 2).mean().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain, _ = made(False)
    model, handle = made(True)
    # x and its product with the model's gain (640 bytes each, bf16) for each layer, and what a
    # SeparateQkvAttention saves: never a parameter (the gain, a projection's weight).
    saves, _, distinct = separate_qkv_saves()
    per_step = 2 * (640 + distinct)
    passes = []
    for _ in range(3):
        handle.stats.reset()
        grads = step(model)
        assert all(torch.equal(a, b) for a, b in zip(grads, step(plain)))
        assert (handle.stats.swapped, handle.stats.bytes_to_host) == (2 * (1 + saves), per_step)
        assert handle.stats.bytes_to_device == per_step
        run = [c.cell_contents for c in model.forward.forward.__closure__
               if isinstance(c.cell_contents, list) and c.cell_contents
               and isinstance(c.cell_contents[0], swap_module._Pass)][0][0]
        passes.append((len(run.calls), run.base))
    # Each step's two calls, the finished step's dropped: the per-step state does not grow.
    assert [n for n, _ in passes] == [2, 2, 2]
    handle.remove()


def test_a_module_used_at_two_places_is_named_by_either_of_its_names():
    """named_modules() names a shared module once; swap takes each name it answers to, as
    recompute_activations and model.get_submodule() do, and swaps the module once."""
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.proj(x).softmax(-1)

    class Block(torch.nn.Module):
        def __init__(self, attention):
            super().__init__()
            self.attention = attention

        def forward(self, x):
            return x + self.attention(x)
    shared = Attention()
    model = torch.nn.Sequential(Block(shared), Block(shared))
    x = torch.randn(4, 8)
    model(x).sum().backward()
    plain = shared.proj.weight.grad.clone()
    shared.proj.weight.grad = None
    for name in ("1.attention", "0.attention"):
        handle = swap_activations(model, names=[name])
        model(x).sum().backward()
        assert torch.equal(shared.proj.weight.grad, plain)
        shared.proj.weight.grad = None
        handle.remove()
