"""What the user writes into a shared-storage optimizer's parameters and state by hand: an in-place
write to a parameter (p.zero_(), a pruning mask, nn.init, model.load_state_dict() without attach())
becomes its fp32 master exactly, and a state tensor put in opt.state is stepped from its values
without the kernel writing past it. Values compared as bits (stowage.torch.optim, docs/pytorch_optimizers.md)."""
import pytest

torch = pytest.importorskip("torch")

from stowage import InvalidArgumentError  # noqa: E402
from stowage.torch.optim import SharedStorageAdamW, SharedStorageSGD  # noqa: E402
from stowage.torch.reference import MasterWeightsOptimizer  # noqa: E402
from optim_training import batches, bits, make_model, train  # noqa: E402


def bf16_checkpoint(seed):
    """Weights bf16 holds exactly (an fp32 model takes them as they are), with a zero bias: a
    stale residual under a bf16 zero was a NaN master."""
    sd = {k: v.to(torch.bfloat16).float() for k, v in make_model(seed).state_dict().items()}
    sd["0.bias"].zero_()
    return sd


def _pruned(model):
    w = model[0].weight
    w.mul_((w.detach().float().abs() > 0.05).to(w.dtype))
    return ["0.weight"]


# Each writes in place into the parameters of the bf16 model and names those it wrote (a mask
# writes the whole parameter: the elements it keeps lose their low bits too, docs/pytorch_optimizers.md).
WRITES = {
    "zero_": lambda model: (model[0].weight.zero_(), ["0.weight"])[1],
    "nn.init.constant_": lambda model: (torch.nn.init.constant_(model[2].weight, -1.5), ["2.weight"])[1],
    "copy_": lambda model: (model[0].bias.copy_(torch.linspace(-1, 1, 40)), ["0.bias"])[1],
    "pruning mask": _pruned,
    "load_state_dict without attach": lambda model: (model.load_state_dict(bf16_checkpoint(3)),
                                                     [n for n, _ in model.named_parameters()])[1],
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_value_written_in_place_becomes_the_master_and_training_goes_on_as_plain_pytorch(write):
    """The reference keeps fp32 masters apart from its bf16 copy: the value written goes into its
    master as into an fp32 model's weight. Before, the bf16 plane changed under the old residual,
    and a written 0 merged into a NaN master."""
    data = batches(6)
    ours, base = make_model(), make_model()
    opt = SharedStorageAdamW(ours.parameters(), lr=1e-2, weight_decay=0.1)
    ref = MasterWeightsOptimizer(base.parameters(), lr=1e-2, weight_decay=0.1)
    assert train(ours, opt, data[:3]) == train(base, ref, data[:3])
    with torch.no_grad():
        written = WRITES[write](ours)
    for i, (name, p) in enumerate(ours.named_parameters()):
        if name in written:
            value = p.detach().float()  # what the model computes with now
            assert torch.equal(bits(opt.master(p)), bits(value)), name
            ref.masters[i].copy_(value)
            ref.params[i].data.copy_(p.detach())
        else:
            assert torch.equal(bits(opt.master(p)), bits(ref.masters[i])), name
    assert train(ours, opt, data[3:]) == train(base, ref, data[3:])
    for p, q, master in zip(ours.parameters(), base.parameters(), ref.masters):
        assert torch.equal(bits(opt.master(p)), bits(master))
        assert torch.equal(bits(p), bits(q)) and not p.isnan().any()


@pytest.mark.parametrize("rounding", ["nearest_even", "half_up"])
def test_a_written_value_is_the_master_bit_for_bit_in_both_roundings(rounding):
    model = make_model()
    opt = SharedStorageSGD(model.parameters(), lr=0.1, momentum=0.9, rounding=rounding)
    train(model, opt, batches(2))
    w = model[0].weight
    # bf16 patterns across the whole range, -0 and +0 first (where a stale residual gave NaN), infinities last.
    patterns = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    finite = patterns[patterns.isfinite()]
    picked = torch.cat([torch.tensor([-0.0, 0.0]).to(torch.bfloat16),
                        finite[torch.linspace(0, len(finite) - 1, w.numel() - 4).long()],
                        torch.tensor([float("-inf"), float("inf")]).to(torch.bfloat16)])
    value = picked.view(w.shape)
    with torch.no_grad():
        w.copy_(value)
    assert torch.equal(bits(opt.master(w)), bits(value.float()))
    sd = opt.state_dict()  # the same through a checkpoint
    assert torch.equal(bits(sd["stowage_master"][0]), bits(value.float()))


def test_a_write_before_a_load_of_the_models_own_weights_stays_the_master():
    """Under attach(), model.load_state_dict(model.state_dict()) copies each parameter onto itself
    and changes nothing, as in torch; a value written in place before it stays the master."""
    model = make_model()
    opt = SharedStorageAdamW(model.parameters(), lr=1e-2)
    opt.attach(model)
    train(model, opt, batches(2))
    before = {name: opt.master(p) for name, p in model.named_parameters()}
    with torch.no_grad():
        model[0].bias.zero_()
    model.load_state_dict(model.state_dict())
    for name, p in model.named_parameters():
        want = torch.zeros(40) if name == "0.bias" else before[name]
        assert torch.equal(bits(opt.master(p)), bits(want)), name


@pytest.mark.parametrize("kind, key", [("adamw", "exp_avg"), ("adamw", "exp_avg_sq"), ("sgd", "momentum_buffer")])
def test_a_state_tensor_put_in_by_hand_is_stepped_from_its_values_and_nothing_past_it_is_written(kind, key):
    """opt.state[p][key] = torch.zeros_like(p) gives a bf16 tensor now (p is bf16): 2 bytes an
    element, where the kernel wrote 4 by its address, past its end. It is taken as its values in
    fp32, as torch.optim would read them."""
    make = (lambda m: SharedStorageAdamW(m.parameters(), lr=1e-2)) if kind == "adamw" else (
        lambda m: SharedStorageSGD(m.parameters(), lr=0.05, momentum=0.9))
    data = batches(4)
    a, b = make_model(), make_model()
    oa, ob = make(a), make(b)
    train(a, oa, data[:1])
    train(b, ob, data[:1])
    pa, pb = a[0].weight, b[0].weight
    n = pa.numel()
    arena = torch.full((2 * n,), 3.0, dtype=torch.bfloat16)  # [the moment given | what follows it]
    arena[:n] = (oa.state[pa][key].flatten() * 0.5).to(torch.bfloat16)
    before = arena.clone()
    oa.state[pa][key] = arena[:n].view(pa.shape)
    ob.state[pb][key] = arena[:n].float().view(pb.shape)  # the same values in fp32
    assert train(a, oa, data[1:]) == train(b, ob, data[1:])
    assert torch.equal(bits(arena), bits(before))  # neither the tensor given nor what follows it was written
    assert oa.state[pa][key].dtype == torch.float32 and oa.state[pa][key].shape == pa.shape
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(bits(oa.master(p)), bits(ob.master(q)))
        assert torch.equal(bits(oa.state[p][key]), bits(ob.state[q][key]))


def test_offloaded_state_put_in_by_hand_goes_back_to_its_home():
    """Offloaded state lives where the kernel can reach it (stowage's pool, mapped on a GPU): a
    tensor put in by hand, even fp32 of the right shape, is copied there."""
    data = batches(3)
    a, b = make_model(), make_model()
    oa = SharedStorageAdamW(a.parameters(), lr=1e-2, state_offload="mapped", state_device_budget=0)
    ob = SharedStorageAdamW(b.parameters(), lr=1e-2)
    train(a, oa, data[:1])
    train(b, ob, data[:1])
    host = oa.state_host_bytes()
    given = torch.ones(a[0].weight.shape)
    oa.state[a[0].weight]["exp_avg"] = given
    ob.state[b[0].weight]["exp_avg"] = given.clone()
    assert train(a, oa, data[1:]) == train(b, ob, data[1:])
    assert oa.state[a[0].weight]["exp_avg"] is not given and torch.equal(given, torch.ones_like(given))
    assert oa.state_host_bytes() == host
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(bits(oa.master(p)), bits(ob.master(q)))


@pytest.mark.parametrize("bad, got", [
    (lambda p, big: big[:10], r"of torch.float32 \(10,\) on cpu"),  # another element count
    (lambda p, big: torch.zeros(p.shape, dtype=torch.int32), r"of torch.int32 \(7, 40\)"),
    (lambda p, big: torch.zeros(p.shape, device="meta"), r"of torch.float32 \(7, 40\) on meta"),
    (lambda p, big: 0.0, r"of float"),
], ids=["numel", "int", "device", "not a tensor"])
def test_state_that_has_no_values_for_the_parameter_is_refused_before_any_parameter_is_updated(bad, got):
    model = make_model()
    opt = SharedStorageAdamW(model.parameters(), lr=1e-2)
    train(model, opt, batches(1))
    big = torch.zeros(100_000)
    p = model[2].weight  # after parameters already bound for this step
    opt.state[p]["exp_avg_sq"] = bad(p, big)
    before = [bits(opt.master(q)) for q in model.parameters()]
    counts = [float(opt.state[q]["step"]) for q in model.parameters()]
    expected = (r"step\(\): parameter 2 of param group 0 has state\['exp_avg_sq'\] " + got
                + r".*280 elements \(7, 40\) on cpu.*No parameter was updated")
    with pytest.raises(InvalidArgumentError, match=expected):
        train(model, opt, batches(1, seed=2))
    assert not big.any()
    assert all(torch.equal(b, bits(opt.master(q))) for b, q in zip(before, model.parameters()))
    assert [float(opt.state[q]["step"]) for q in model.parameters()] == counts


def test_a_momentum_buffer_set_to_none_starts_afresh_as_torch_optim_reads_it():
    data = batches(4)
    a, b = make_model(), make_model()
    oa, ob = (SharedStorageSGD(m.parameters(), lr=0.05, momentum=0.9) for m in (a, b))
    train(a, oa, data[:2])
    train(b, ob, data[:2])
    oa.state[a[0].weight]["momentum_buffer"] = None  # was an AttributeError at the next step
    del ob.state[b[0].weight]["momentum_buffer"]
    assert train(a, oa, data[2:]) == train(b, ob, data[2:])
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(bits(oa.master(p)), bits(ob.master(q)))
