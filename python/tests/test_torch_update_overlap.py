"""overlap_update (stowage.torch.update_overlap): the shared-storage update queued in chunks that
follow the model's order, waited for by each module's forward. On the CPU the update runs at once,
so these tests hold the chunked calls, the hooks and the refusals to the numbers of the plain step;
the GPU tests hold the waits to them with an update made slow on purpose."""
import gc

import pytest

torch = pytest.importorskip("torch")

from stowage import InvalidArgumentError  # noqa: E402
from stowage.torch.adaptor import apply  # noqa: E402
from stowage.torch.optim import SharedStorageAdamW, SharedStorageSGD  # noqa: E402
from stowage.torch.reference import MasterWeightsOptimizer  # noqa: E402
from stowage.torch.update_overlap import CHUNKS, UpdateOverlap  # noqa: E402
from optim_training import batches, bits, make_model, train  # noqa: E402

HYPER = {"adamw": dict(lr=3e-3, weight_decay=0.05, max_grad_norm=0.5),
         "sgd": dict(lr=0.05, momentum=0.9, weight_decay=0.01, max_grad_norm=0.5)}
KINDS = {"adamw": SharedStorageAdamW, "sgd": SharedStorageSGD}


def overlapped(kind, model, groups=None, **extra):
    opt = KINDS[kind](groups if groups is not None else model.parameters(), overlap_update=True,
                      **{**HYPER[kind], **extra})
    opt.attach(model)
    return opt


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_the_chunked_update_gives_the_plain_steps_numbers(kind):
    data = batches(10)
    ours, base = make_model(), make_model()
    opt = overlapped(kind, ours)
    ref = MasterWeightsOptimizer(base.parameters(), kind=kind, **HYPER[kind])
    poison = {4}  # a NaN gradient: skipped by both
    assert train(ours, opt, data, poison) == train(base, ref, data, poison)
    assert len({opt._overlap.chunk_of(p) for p in ours.parameters()}) == 4  # four calls a step, not one
    for p, q, master in zip(ours.parameters(), base.parameters(), ref.masters):
        assert torch.equal(bits(opt.master(p)), bits(master))
        assert torch.equal(bits(p), bits(q))


def test_chunks_follow_the_models_order_not_the_param_groups():
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(CHUNKS)])
    weights = [m.weight for m in model]
    biases = [m.bias for m in model]
    # Groups as a weight-decay split makes them: every bias after every weight.
    opt = overlapped("adamw", model, [{"params": weights}, {"params": biases, "weight_decay": 0.0}])
    order = [opt._overlap.chunk_of(p) for p in model.parameters()]
    assert order == sorted(order) and order[0] == 0 and order[-1] == CHUNKS - 1
    assert [opt._overlap.chunk_of(m.weight) for m in model] == list(range(CHUNKS))  # 272 elements a layer
    # One hook per module holding parameters; none on the container.
    assert [len(m._forward_pre_hooks) for m in model] == [1] * CHUNKS
    assert len(model._forward_pre_hooks) == 0


@pytest.mark.parametrize("overlap", [False, True])
def test_one_finite_check_covers_every_group_and_chunk(overlap):
    # The check joins the batches of a device into one call: a NaN in the last parameter (the
    # second group's, the last chunk's) still skips the whole step.
    model = make_model()
    params = list(model.parameters())
    opt = SharedStorageAdamW([{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.0}],
                             overlap_update=overlap)
    opt.attach(model)
    x, y = batches(1)[0]
    torch.nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
    params[-1].grad.view(-1)[2] = float("inf")
    before = [bits(opt.master(p)) for p in params]
    with pytest.warns(RuntimeWarning, match=r"^step\(\): a gradient holds Inf or NaN, so this step was skipped"):
        opt.step()
    assert opt.last_step_skipped
    assert all(torch.equal(bits(opt.master(p)), b) for p, b in zip(params, before))
    params[-1].grad.view(-1)[2] = 0.0
    opt.step()
    assert not opt.last_step_skipped
    assert not any(torch.equal(bits(opt.master(p)), b) for p, b in zip(params, before))


def test_a_parameter_in_no_attached_model_is_refused_and_nothing_is_written():
    model = make_model()
    opt = SharedStorageAdamW(model.parameters(), overlap_update=True)
    x, y = batches(1)[0]
    torch.nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
    before = [bits(opt.master(p)) for p in model.parameters()]
    with pytest.raises(InvalidArgumentError, match=r"overlap_update .* is in no model given to attach\(\)"):
        opt.step()
    assert all(torch.equal(bits(opt.master(p)), b) for p, b in zip(model.parameters(), before))
    opt.attach(model)
    opt.step()
    assert not torch.equal(bits(opt.master(next(model.parameters()))), before[0])


def test_bad_overlap_options_are_refused():
    model = make_model()
    with pytest.raises(InvalidArgumentError, match="overlap_update must be True or False"):
        SharedStorageAdamW(model.parameters(), overlap_update="yes")
    with pytest.raises(InvalidArgumentError, match="overlap_update must be True or False"):
        apply(model, torch.optim.AdamW(model.parameters()), overlap_update=1)
    with pytest.raises(InvalidArgumentError, match="overlap_update overlaps the shared-storage"):
        apply(model, torch.optim.AdamW(model.parameters()), shared_storage=False, overlap_update=True)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # nothing changed


def test_apply_attaches_and_trains_with_the_same_numbers():
    data = batches(6)
    plain, lapped = make_model(), make_model()
    a = apply(plain, torch.optim.AdamW(plain.parameters(), lr=2e-3), max_grad_norm=1.0)
    b = apply(lapped, torch.optim.AdamW(lapped.parameters(), lr=2e-3), max_grad_norm=1.0, overlap_update=True)
    assert train(plain, a.optimizer, data) == train(lapped, b.optimizer, data)
    for p, q in zip(plain.parameters(), lapped.parameters()):
        assert torch.equal(bits(a.optimizer.master(p)), bits(b.optimizer.master(q)))


def test_zero_grad_either_way_and_the_hooks_go_with_the_optimizer():
    model = make_model()
    opt = overlapped("adamw", model)
    x, y = batches(1)[0]
    torch.nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())
    opt.zero_grad(True)
    assert all(p.grad is None for p in model.parameters())
    opt.wait_for_update()  # nothing queued on the CPU: returns
    assert sum(len(m._forward_pre_hooks) for m in model.modules()) == 2
    del opt
    gc.collect()
    assert sum(len(m._forward_pre_hooks) for m in model.modules()) == 0


def test_a_group_added_later_is_chunked_and_hooked():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    opt = overlapped("adamw", model, [{"params": model[0].parameters()}])
    assert len(model[1]._forward_pre_hooks) == 0 and opt._overlap.chunk_of(model[1].weight) is None
    opt.add_param_group({"params": model[1].parameters()})
    assert len(model[1]._forward_pre_hooks) == 1
    assert opt._overlap.chunk_of(model[1].weight) > opt._overlap.chunk_of(model[0].weight)


class FakeStream:
    """Stands for a CUDA stream: says which events it was made to wait for."""

    def __init__(self, number):
        self.cuda_stream, self.waited = number, []

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        self.waited.append(event.name)


class FakeEvent:
    made = 0

    def record(self, stream):
        FakeEvent.made += 1
        self.name = f"e{FakeEvent.made}"


class FakeGrad:
    def record_stream(self, stream):
        self.recorded_on = stream


def fake_cuda(monkeypatch):
    """The waits' bookkeeping on the CPU: streams and events that only say what was asked of them."""
    current, sides = FakeStream(1), []

    def side(device):
        sides.append(FakeStream(100 + len(sides)))
        return sides[-1]
    monkeypatch.setattr(torch.cuda, "Stream", side)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    FakeEvent.made = 0
    return current


def test_a_forward_waits_for_the_last_kernel_of_its_chunk_and_a_chunk_without_one_hides_nothing(monkeypatch):
    current = fake_cuda(monkeypatch)
    gpu = torch.device("cuda", 0)
    overlap = UpdateOverlap(lambda p: True)
    overlap.begin({gpu})
    grad = FakeGrad()
    for chunk in (0, 0, 2, 5, 5):  # two param groups in chunks 0 and 5; nothing in 1, 3, 4, 6, 7
        overlap.queued(gpu, chunk, [grad])
    assert grad.recorded_on is overlap._streams[gpu]
    assert [c for c, _ in overlap._events[gpu]] == [0, 2, 5]  # e1, e2 (0), e3 (2), e4, e5 (5)
    overlap._wait(gpu, 1)  # chunk 1 queued nothing: chunk 0's second kernel stands for it
    assert current.waited == ["e2"]
    overlap._wait(gpu, 0)  # waited already
    overlap._wait(gpu, 4)
    assert current.waited == ["e2", "e3"] and overlap._pending
    overlap._wait(gpu, 7)  # after the last event: the last one, and nothing is pending any more
    assert current.waited == ["e2", "e3", "e5"] and not overlap._pending
    # A step whose first chunks queue nothing: a module of those chunks waits for nothing, and
    # the later ones are still waited for.
    overlap.begin({gpu})
    overlap.queued(gpu, 6, [grad])
    overlap._wait(gpu, 3)
    assert current.waited == ["e2", "e3", "e5"] and overlap._pending
    overlap._wait(gpu, 7)
    assert current.waited == ["e2", "e3", "e5", "e6"] and not overlap._pending
    overlap.begin({gpu})
    overlap.queued(gpu, 1, [grad])
    overlap.join()
    assert current.waited[-1] == "e7" and not overlap._pending and overlap._events == {}


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def slow_side_stream(monkeypatch):
    """Every chunk's kernel starts 20 M GPU cycles late on the side stream: a forward that did not
    wait for its chunk would read the old weights."""
    placement = UpdateOverlap.placement

    def late(self, device):
        with torch.cuda.stream(self._streams[device]):
            torch.cuda._sleep(20_000_000)
        return placement(self, device)
    monkeypatch.setattr(UpdateOverlap, "placement", late)


class Net(torch.nn.Module):
    """Linear layers, an attention whose forward reads its out_proj's parameters without calling
    it, and a layer that gets no gradient."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU())
                                            for _ in range(4)])
        self.attn = torch.nn.MultiheadAttention(256, 4, batch_first=True)
        self.unused = torch.nn.Linear(256, 256)
        self.head = torch.nn.Linear(256, 7)

    def forward(self, x):
        h = self.blocks(x)[:, None]
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.head((h + a)[:, 0])


def net(device):
    torch.manual_seed(0)
    return Net().to(device)


def weight_decay_groups(model):
    """As a weight-decay split makes them: every bias after every weight, in two groups."""
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if not n.endswith("bias")]},
            {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0}]


def train_accumulating(model, opt, data, accumulate):
    losses = []
    for k in range(0, len(data), accumulate):
        for x, y in data[k:k + accumulate]:
            loss = torch.nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y)
            loss.backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses


@cuda
@pytest.mark.parametrize("state_offload", ["none", "mapped"])
def test_on_cuda_each_forward_waits_for_its_weights(monkeypatch, state_offload):
    import stowage
    if not stowage.using_cuda():
        pytest.skip("libstowage is not using CUDA here")
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(64, 256, generator=g).cuda(), torch.randint(0, 7, (64,), generator=g).cuda())
            for _ in range(16)]
    plain, lapped = net("cuda"), net("cuda")
    hyper = dict(lr=1e-3, max_grad_norm=1.0, state_offload=state_offload)
    a = SharedStorageAdamW(weight_decay_groups(plain), **hyper)
    b = SharedStorageAdamW(weight_decay_groups(lapped), overlap_update=True, **hyper)
    b.attach(lapped)
    assert len(lapped.attn._forward_pre_hooks) == 1  # it reads out_proj's parameters itself
    # Weights and biases (two groups) share chunks; chunks 4 and 5 queue nothing (in_proj_weight
    # starts in 3 and spans them); out_proj's parameters are in later chunks than in_proj's.
    assert sorted({b._overlap.chunk_of(p) for p in lapped.parameters()}) == [0, 1, 2, 3, 6, 7]
    slow_side_stream(monkeypatch)
    assert train_accumulating(plain, a, data, 4) == train_accumulating(lapped, b, data, 4)
    b.wait_for_update()
    for p, q in zip(plain.parameters(), lapped.parameters()):
        assert torch.equal(bits(p), bits(q))  # read after wait_for_update(): the last update is in
        assert torch.equal(bits(a.master(p)), bits(b.master(q)))
