"""nn.Embedding / nn.EmbeddingBag with max_norm on a shared-storage optimizer's weight
(stowage.torch.embedding_renorm; docs/pytorch_optimizers.md, in-place writes). Every forward
renormalises the rows it looks up in place, which torch counts as a write of the weight even when
no row changes: under attach() only the rows whose bits changed take their bf16 values as their
master; without attach() the whole table does, as any in-place write. CPU; bit for bit."""
import copy
import gc

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from stowage.torch.adaptor import apply  # noqa: E402
from stowage.torch.optim import SharedStorageAdamW, SharedStorageSGD, _Bucket  # noqa: E402
from stowage.torch.reference import MasterWeightsOptimizer  # noqa: E402
from optim_training import bits  # noqa: E402
from pickling import loaded_without_stowage  # noqa: E402

VOCAB, DIM, STEPS = 40, 8, 6
# nn.Embedding's N(0, 1) rows of 8 have norms about 2.8: about half exceed this one.
REACHED = 2.5
HYPER = {"adamw": dict(lr=1e-3, weight_decay=0.01), "sgd": dict(lr=0.05, momentum=0.9, weight_decay=0.01)}


class Model(nn.Module):
    def __init__(self, max_norm, bag=False, keyword=False):
        super().__init__()
        torch.manual_seed(0)
        self.emb = (nn.EmbeddingBag if bag else nn.Embedding)(VOCAB, DIM, max_norm=max_norm)
        self.head = nn.Linear(DIM, VOCAB)
        self.keyword = keyword

    def forward(self, x, offsets=None):
        if isinstance(self.emb, nn.EmbeddingBag):
            return self.head(self.emb(x, offsets))
        return self.head(self.emb(input=x) if self.keyword else self.emb(x))


def data(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, VOCAB, (4, 6), generator=g), torch.randint(0, VOCAB, (4, 6), generator=g)


def loss_of(model, x, y):
    out = model(x).float()
    return F.cross_entropy(out.flatten(0, -2), y.flatten() if out.dim() == 3 else y[:, 0])


def shared(model, kind, attach=True):
    """The model under the shared-storage optimizer: through apply() (which attaches), or made by hand."""
    if not attach:
        return (SharedStorageAdamW if kind == "adamw" else SharedStorageSGD)(model.parameters(), **HYPER[kind])
    given = (torch.optim.AdamW if kind == "adamw" else torch.optim.SGD)(model.parameters(), **HYPER[kind])
    return apply(model, given).optimizer


def train(model, opt, steps=STEPS):
    """The losses and, after each step, every parameter's master as int32 bits (lists: == compares them)."""
    masters, losses = [], []
    for step in range(steps):
        opt.zero_grad()
        loss = loss_of(model, *data(step))
        loss.backward()
        opt.step()
        losses.append(loss.item())
        masters.append([bits(opt.master(p)).tolist() for p in model.parameters()])
    return losses, masters


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_a_max_norm_never_reached_trains_bit_for_bit_as_without_one(kind):
    """Each forward still renormalises (the weight's count moves), but no row changes: every master
    keeps its low bits. Before, the whole table's masters became their bf16 values at every step."""
    plain, normed = Model(None), Model(1e6)
    opt_plain, opt_normed = shared(plain, kind), shared(normed, kind)
    version = normed.emb.weight._version
    assert train(plain, opt_plain) == train(normed, opt_normed)
    assert normed.emb.weight._version == version + STEPS  # one renorm a forward, each counted as a write
    for p, q in zip(plain.parameters(), normed.parameters()):
        assert torch.equal(bits(p), bits(q))
    w = normed.emb.weight
    assert not torch.equal(bits(opt_normed.master(w)), bits(w.float()))  # the masters have low bits


def reference_run(kind, steps=STEPS):
    """fp32 masters and a bf16 copy (stowage.torch.reference) on the model with max_norm: the forward
    renormalises the copy's rows; before each step the rows where the copy no longer is its master's
    rounding (those the renorm changed) take the copy's values as their master, as an fp32 model's
    weight would be the value written. Returns its losses and masters after each step."""
    model = Model(REACHED)
    ref = MasterWeightsOptimizer(model.parameters(), kind=kind, **HYPER[kind])
    w, master = model.emb.weight, ref.masters[0]
    losses, masters, renormed = [], [], []
    for step in range(steps):
        ref.zero_grad()
        loss = loss_of(model, *data(step))
        loss.backward()
        changed = (bits(w) != bits(master.to(torch.bfloat16))).any(1)
        master[changed] = w.detach()[changed].float()
        renormed.append(int(changed.sum()))
        ref.step()
        losses.append(loss.item())
        masters.append([bits(m).tolist() for m in ref.masters])
    return losses, masters, renormed


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_rows_the_renorm_changes_take_their_bf16_values_and_the_others_keep_their_masters(kind):
    model = Model(REACHED)
    opt = shared(model, kind)
    w = model.emb.weight
    ref_losses, ref_masters, renormed = reference_run(kind)
    assert all(n > 0 for n in renormed[:2]) and renormed[0] < VOCAB  # the renorm changes some rows, not all
    for step in range(STEPS):
        opt.zero_grad()
        before, weight_before = opt.master(w), w.detach().clone()
        loss = loss_of(model, *data(step))
        after = opt.master(w)
        changed = (bits(w) != bits(weight_before)).any(1)
        assert int(changed.sum()) == renormed[step]
        assert torch.equal(bits(after[changed]), bits(w.detach()[changed].float()))  # the bf16 value exactly
        assert torch.equal(bits(after[~changed]), bits(before[~changed]))  # bit for bit as they were
        loss.backward()
        opt.step()
        assert loss.item() == ref_losses[step]
        for p, expected in zip(model.parameters(), ref_masters[step]):
            assert bits(opt.master(p)).tolist() == expected, step


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_an_evaluation_forward_takes_the_rows_it_changed_too(mode):
    """torch renormalises under no_grad and inference_mode as well (model.eval() between steps)."""
    model = Model(REACHED)
    opt = shared(model, "adamw")
    w = model.emb.weight
    master, weight = opt.master(w), w.detach().clone()
    with mode():
        model(data(0)[0])
    changed = (bits(w) != bits(weight)).any(1)
    assert 0 < int(changed.sum()) < VOCAB
    assert torch.equal(bits(opt.master(w)[changed]), bits(w.detach()[changed].float()))
    assert torch.equal(bits(opt.master(w)[~changed]), bits(master[~changed]))


def test_without_attach_the_renorm_is_a_write_of_the_whole_table():
    """As documented for in-place writes: an optimizer made by hand and not attached takes the whole
    weight as written at each forward, the rows the input did not look up included."""
    for attach in (False, True):
        model = Model(1e6)
        opt = shared(model, "adamw", attach=False)
        if attach:
            opt.attach(model)
        w = model.emb.weight
        master = opt.master(w)
        assert not torch.equal(bits(master), bits(w.float()))
        x = torch.tensor([[1, 2, 3]])
        model(x)
        expected = bits(w.float()) if not attach else bits(master)
        assert torch.equal(bits(opt.master(w)), expected)


def test_another_write_pending_or_in_the_same_forward_takes_the_whole_table_as_before():
    model = Model(1e6)
    opt = shared(model, "adamw")
    w = model.emb.weight
    x = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        w[5].mul_(1.0)  # an in-place write the optimizer has not taken yet: the forward leaves it pending
    model(x)
    assert torch.equal(bits(opt.master(w)), bits(w.float()))
    model = Model(1e6)
    opt = shared(model, "adamw")
    w = model.emb.weight
    master = opt.master(w)
    model(x)
    assert torch.equal(bits(opt.master(w)), bits(master))

    def write(module, inputs):  # a pre-hook registered after apply(): it writes after the optimizer's snapshot
        with torch.no_grad():
            module.weight[0].mul_(1.0)

    handle = model.emb.register_forward_pre_hook(write)
    model(x)
    assert torch.equal(bits(opt.master(w)), bits(w.float()))
    handle.remove()


def test_the_input_by_keyword_gives_the_reference_numbers():
    """PyTorch before 2.0 gives forward pre-hooks no keyword arguments: the pre-hook then keeps the
    whole table (exact, at the cost of a copy of it)."""
    keyword = Model(REACHED, keyword=True)
    assert train(keyword, shared(keyword, "adamw")) == reference_run("adamw")[:2]


def _bf16_embedding_bag():
    try:
        F.embedding_bag(torch.tensor([[0]]), torch.zeros(1, 1, dtype=torch.bfloat16))
    except RuntimeError:
        return False
    return True


@pytest.mark.skipif(not _bf16_embedding_bag(), reason="this PyTorch's CPU embedding_bag has no bf16 (1.13)")
@pytest.mark.parametrize("offsets", [False, True], ids=["2d", "1d_offsets"])
def test_an_embedding_bag_takes_only_the_rows_it_changed(offsets):
    def step_all(model, opt, ref=None):
        out = []
        for step in range(STEPS):
            opt.zero_grad()
            x, y = data(step)
            args = (x.flatten(), torch.arange(0, x.numel(), x.shape[1])) if offsets else (x,)
            if ref is not None:
                w, master = model.emb.weight, ref.masters[0]
                loss = F.cross_entropy(model(*args).float(), y[:, 0])
                changed = (bits(w) != bits(master.to(torch.bfloat16))).any(1)
                master[changed] = w.detach()[changed].float()
            else:
                loss = F.cross_entropy(model(*args).float(), y[:, 0])
            loss.backward()
            opt.step()
            out.append(loss.item())
        masters = ref.masters if ref is not None else [opt.master(p) for p in model.parameters()]
        return out, [bits(m).tolist() for m in masters]

    ours, base = Model(REACHED, bag=True), Model(REACHED, bag=True)
    ref = MasterWeightsOptimizer(base.parameters(), kind="adamw", **HYPER["adamw"])
    assert step_all(ours, shared(ours, "adamw")) == step_all(base, ref, ref)


def test_attach_hooks_each_module_once_after_the_overlaps_hook_and_the_hooks_go_with_the_optimizer():
    model = nn.Sequential(nn.Embedding(VOCAB, DIM, max_norm=REACHED), nn.Embedding(VOCAB, DIM),
                          nn.EmbeddingBag(VOCAB, DIM, max_norm=REACHED))
    opt = SharedStorageAdamW([{"params": model[1:].parameters()}], overlap_update=True)
    opt.attach(model)
    assert not model[0]._forward_pre_hooks and not model[0]._forward_hooks  # not the optimizer's weight
    opt.add_param_group({"params": model[0].parameters()})  # an attached model's: hooked as it joins
    opt.attach(model)  # again: nothing hooked twice
    counts = [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model]
    assert counts == [(2, 1), (1, 0), (2, 1)]  # the second has no max_norm: the overlap's pre-hook only
    for m in (model[0], model[2]):  # the overlap's first: the rows are read once their update is written
        assert list(m._forward_pre_hooks.values())[0] == opt._overlap._before_forward
    del opt
    gc.collect()
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model)


def test_a_copy_or_pickle_of_the_model_leaves_the_masters_alone():
    model = Model(REACHED)
    opt = shared(model, "adamw")
    w = model.emb.weight
    master, version = opt.master(w), w._version
    for other in (copy.deepcopy(model), loaded_without_stowage(model)):
        loss_of(other, *data(0)).backward()  # renormalises the copy's own rows
        assert not torch.equal(bits(other.emb.weight), bits(w))
    assert w._version == version and torch.equal(bits(opt.master(w)), bits(master))
    weight = w.detach().clone()
    loss_of(model, *data(0))  # the original's hooks still take only the rows its renorm changed
    changed = (bits(w) != bits(weight)).any(1)
    assert 0 < int(changed.sum()) < VOCAB
    assert torch.equal(bits(opt.master(w)[~changed]), bits(master[~changed]))
    assert torch.equal(bits(opt.master(w)[changed]), bits(w.detach()[changed].float()))


@pytest.mark.parametrize("width", [5, 3, 1, 8, 12, 16, 21])
@pytest.mark.parametrize("rounding", ["nearest_even", "half_up"])
def test_rows_taken_in_place_are_what_split_writes_for_their_bf16_values(rounding, width):
    """_Bucket.take_bf16_rows against split() of the whole parameter with those rows replaced by
    their bf16 values: every byte of the planes, ties set all around (rows whose width is not a
    multiple of 8 share tie bytes; rows narrower than 8 several in one byte), the next parameter's
    planes untouched."""
    g = torch.Generator().manual_seed(width)
    u = torch.randint(0, 1 << 16, (13, width), generator=g, dtype=torch.int32)
    u = ((u & 0x7FFE) + 0x3C00) << 16  # finite, even high halves around 1
    u |= torch.where(torch.rand(13, width, generator=g) < 0.5, 0x8000,
                     torch.randint(0, 1 << 16, (13, width), generator=g, dtype=torch.int32))
    first, second = u.view(torch.float32), torch.randn(3, 7, generator=g)
    taken, expected = _Bucket([first, second], rounding), _Bucket([first, second], rounding)
    for bucket in (taken, expected):
        bucket.split(0, first)
        bucket.split(1, second)
    if rounding == "nearest_even":
        assert int(taken.ties[:-(-13 * width // 8)].ne(0).sum()) > 1  # ties in the rows' bytes
    rows = torch.tensor([0, 1, 3, 4, 12])
    values = first.clone()
    values[rows] = taken.view(0, first.shape)[rows].float()  # the bf16 plane's values, in either rounding
    taken.take_bf16_rows(0, tuple(first.shape), rows)
    expected.split(0, values)
    for a, b in ((taken.bf16, expected.bf16), (taken.residual, expected.residual), (taken.ties, expected.ties)):
        assert torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a, b.view(torch.int16)
                           if b.dtype == torch.bfloat16 else b)
    assert torch.equal(bits(taken.merge(0, first.shape)), bits(values))
    assert torch.equal(bits(taken.merge(1, second.shape)), bits(second))


class Shifted(nn.Embedding):
    """As Hugging Face's BartLearnedPositionalEmbedding: its forward looks up other rows than its
    input names (input + 10)."""

    def forward(self, x):
        return super().forward(x + 10)


class Named(nn.Embedding):
    """A subclass with torch's own forward."""


def test_a_subclass_with_a_forward_of_its_own_takes_the_whole_table_as_written():
    """A snapshot of the rows the input names would miss the rows renormalised (10, 11, 12 here),
    and the count moved by one, the renorm's: those rows would keep their old residuals under the
    new bf16 values. Not hooked, the renorm is a write of the whole table, as without attach()."""
    for cls, hooked in ((Shifted, False), (Named, True)):
        model = Model(REACHED)
        torch.manual_seed(0)
        model.emb = cls(VOCAB, DIM, max_norm=1.0)  # N(0, 1) rows of 8: every row exceeds it
        opt = shared(model, "adamw")
        w = model.emb.weight
        assert bool(model.emb._forward_hooks) == hooked
        master, weight = opt.master(w), w.detach().clone()
        assert not torch.equal(bits(master), bits(w.float()))
        loss_of(model, torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 2]]))
        changed = (bits(w) != bits(weight)).any(1)
        assert changed.nonzero().flatten().tolist() == ([10, 11, 12] if cls is Shifted else [0, 1, 2])
        assert torch.equal(bits(opt.master(w)[changed]), bits(w.detach()[changed].float()))  # the bf16 values
        expected = bits(w.float()) if cls is Shifted else bits(master)  # the whole table, or only the rows changed
        assert torch.equal(bits(opt.master(w)[~changed]), expected[~changed])


@pytest.mark.parametrize("how", ["returned", "in_place"])
def test_a_pre_hook_registered_later_that_changes_the_input_takes_the_whole_table(how):
    """The optimizer's pre-hook saved the rows of the input it saw; a pre-hook that runs after it
    and gives forward another input (returns a new one, or writes into it) makes forward renormalise
    other rows: the forward hook sees that the input is not the one saved and leaves the write whole."""
    model = Model(REACHED)
    torch.manual_seed(0)
    model.emb = nn.Embedding(VOCAB, DIM, max_norm=1.0)
    opt = shared(model, "adamw")
    w = model.emb.weight

    def shift(module, inputs):
        if how == "returned":
            return (inputs[0] + 10,)
        inputs[0].add_(10)

    model.emb.register_forward_pre_hook(shift)
    master, weight = opt.master(w), w.detach().clone()
    assert not torch.equal(bits(master), bits(w.float()))
    model(torch.tensor([[0, 1, 2]]))
    assert (bits(w) != bits(weight)).any(1).nonzero().flatten().tolist() == [10, 11, 12]
    assert torch.equal(bits(opt.master(w)), bits(w.float()))
