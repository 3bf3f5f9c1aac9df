"""model.load_state_dict() on a model under shared storage writes each loaded value into the fp32
master, bit for bit, as the fp32 model it replaced would take it as its weight: a resume that loads
the model's weights, a pretrained checkpoint loaded after apply(), a load through a wrapper module
or into a submodule. Values compared as bits (stowage.torch.optim, docs/pytorch_optimizers.md)."""
import copy
import inspect

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import stowage  # noqa: E402
from stowage import InvalidArgumentError  # noqa: E402
from stowage.torch.adaptor import apply  # noqa: E402
from stowage.torch.optim import SharedStorageAdamW  # noqa: E402
from optim_training import batches, bits, make_model, train  # noqa: E402
from pickling import loaded_without_stowage  # noqa: E402


def fp32_weights(seed):
    """A checkpoint of the test model with fp32 values that bf16 cannot hold (low bits set)."""
    return {k: v.clone() for k, v in make_model(seed).state_dict().items()}


def masters(opt, model):
    return {name: opt.master(p) for name, p in model.named_parameters()}


def assert_masters_are(opt, model, sd, prefix=""):
    for name, p in model.named_parameters():
        want = sd[prefix + name].to(torch.float32)
        assert torch.equal(bits(opt.master(p)), bits(want)), name
        assert torch.equal(bits(p), bits(want.to(torch.bfloat16))), name  # the view is its rounding


def trained(seed=0, steps=3):
    model = make_model(seed)
    opt = apply(model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)).optimizer
    train(model, opt, batches(steps))
    return model, opt


def test_an_fp32_checkpoint_loaded_into_the_model_becomes_the_master_bit_for_bit():
    model, opt = trained()
    sd = fp32_weights(5)
    assert any(torch.any(bits(v) & 0xFFFF != 0) for v in sd.values())  # the low halves matter
    model.load_state_dict(sd)
    assert_masters_are(opt, model, sd)
    # Training goes on from it exactly as from the same master written by load_master_state_dict()
    # (the same three steps before: the same m, v and step).
    other, other_opt = trained()
    other_opt.load_master_state_dict(other, sd)
    data = batches(4, seed=9)
    assert train(model, opt, data) == train(other, other_opt, data)
    for p, q in zip(model.parameters(), other.parameters()):
        assert torch.equal(bits(opt.master(p)), bits(other_opt.master(q)))


def test_loaded_values_of_other_dtypes_become_the_master_as_the_fp32_model_takes_them():
    model, opt = trained()
    src = fp32_weights(6)
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        sd = {k: v.to(dtype) for k, v in src.items()}
        model.load_state_dict(sd)
        fp32 = make_model(1)
        fp32.load_state_dict(sd)  # what the fp32 model's copy_ makes of them
        for (name, p), q in zip(model.named_parameters(), fp32.parameters()):
            assert torch.equal(bits(opt.master(p)), bits(q)), (dtype, name)
    # A bf16 value's master has no low bits: the residual of the old master is gone.
    sd = {k: v.to(torch.bfloat16) for k, v in src.items()}
    model.load_state_dict(sd)
    assert all(torch.all(bits(opt.master(p)) & 0xFFFF == 0) for p in model.parameters())


def test_a_load_through_a_wrapper_or_into_a_submodule_writes_the_masters_it_names():
    model, opt = trained()
    before = masters(opt, model)
    sd = fp32_weights(7)
    # A submodule's own load: only its parameters change.
    model[2].load_state_dict({"weight": sd["2.weight"], "bias": sd["2.bias"]})
    assert torch.equal(bits(opt.master(model[2].weight)), bits(sd["2.weight"]))
    assert torch.equal(bits(opt.master(model[0].weight)), bits(before["0.weight"]))
    # A wrapper around the model (as DistributedDataParallel is: "module." before every key).
    wrapper = nn.ModuleDict({"module": model})
    wrapper.load_state_dict({"module." + k: v for k, v in sd.items()})
    assert_masters_are(opt, model, sd)


def test_a_partial_or_refused_load_leaves_the_other_masters_as_they_were():
    model, opt = trained()
    before = masters(opt, model)
    sd = fp32_weights(8)
    # strict=False with keys missing: what is there is loaded, the rest keeps its master.
    model.load_state_dict({"0.weight": sd["0.weight"]}, strict=False)
    assert torch.equal(bits(opt.master(model[0].weight)), bits(sd["0.weight"]))
    for name in ("0.bias", "2.weight", "2.bias"):
        assert torch.equal(bits(masters(opt, model)[name]), bits(before[name])), name
    # A size mismatch is torch's error, and that parameter's master is not touched.
    before = masters(opt, model)
    with pytest.raises(RuntimeError, match="size mismatch for 2.bias"):
        model.load_state_dict({**sd, "2.bias": torch.zeros(3)})
    assert torch.equal(bits(opt.master(model[2].bias)), bits(before["2.bias"]))


def test_a_tied_weight_takes_the_last_value_loaded_as_torch_copies_it():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight

    torch.manual_seed(0)
    model = Tied()
    opt = apply(model, torch.optim.AdamW(model.parameters())).optimizer
    sd = {"emb.weight": torch.randn(10, 4), "head.weight": torch.randn(10, 4)}
    model.load_state_dict(sd)
    plain = Tied()
    plain.load_state_dict(sd)
    assert torch.equal(bits(opt.master(model.emb.weight)), bits(plain.emb.weight))
    assert torch.equal(bits(plain.emb.weight), bits(sd["head.weight"]))


def test_copies_of_the_model_load_as_plain_models_and_leave_the_masters_alone():
    model, opt = trained()
    before = masters(opt, model)
    sd = {k: v.to(torch.bfloat16) for k, v in fp32_weights(9).items()}
    ema = copy.deepcopy(model)
    loaded = loaded_without_stowage(model)
    for copied in (ema, loaded):
        copied.load_state_dict(sd)
        assert all(torch.equal(bits(p), bits(sd[name])) for name, p in copied.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(bits(opt.master(p)), bits(before[name])), name


def test_attach_routes_loads_for_an_optimizer_made_without_apply():
    model = make_model()
    opt = SharedStorageAdamW(model.parameters(), lr=1e-2)
    sd = fp32_weights(3)
    opt.attach(model)
    opt.attach(model)  # once per module: the second call adds no second hook
    assert sum(len(m._load_state_dict_pre_hooks) for m in model.modules()) == 2
    model.load_state_dict(sd)
    assert_masters_are(opt, model, sd)


def test_a_parameter_replaced_after_the_optimizer_took_it_is_loaded_by_torch_and_refused_by_step():
    model, opt = trained()
    before = opt.master(model[0].weight)
    model[0].weight.data = torch.zeros(40, 24)  # no longer the plane's view
    sd = fp32_weights(4)
    model.load_state_dict(sd)
    assert torch.equal(model[0].weight, sd["0.weight"])  # torch's copy into the replaced data
    assert torch.equal(bits(opt.master(model[0].weight)), bits(before))  # the master is not written
    with pytest.raises(InvalidArgumentError, match="parameter '0.weight' is no longer the bf16 view"):
        opt.step()


def test_a_group_added_after_attach_is_loaded_into_its_masters_too():
    model = make_model()
    head = list(model[2].parameters())
    opt = SharedStorageAdamW(model[0].parameters(), lr=1e-2)  # the head frozen at first (fp32, not held)
    opt.attach(model)
    opt.add_param_group({"params": head})  # unfrozen later
    sd = fp32_weights(2)
    model.load_state_dict(sd)
    assert_masters_are(opt, model, sd)


def test_loading_the_models_own_state_dict_changes_nothing_as_in_torch():
    """model.state_dict() gives the parameters themselves (bf16 views): loaded back, each master keeps
    its low bits (they were rounded away to bf16 before)."""
    model, opt = trained()
    before = masters(opt, model)
    assert any(torch.any(bits(m) & 0xFFFF != 0) for m in before.values())
    model.load_state_dict(model.state_dict())
    for name, p in model.named_parameters():
        assert torch.equal(bits(opt.master(p)), bits(before[name])), name
    # A copy of those values is a bf16 checkpoint like any other: its values become the masters.
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(sd)
    assert_masters_are(opt, model, sd)


def test_a_meta_value_is_torchs_error_and_the_master_stays():
    model, opt = trained()
    before = opt.master(model[0].weight)
    sd = {**fp32_weights(3), "0.weight": torch.empty(40, 24, device="meta")}
    with pytest.raises(RuntimeError, match="0.weight"):
        model.load_state_dict(sd)
    assert torch.equal(bits(opt.master(model[0].weight)), bits(before))


@pytest.mark.skipif("assign" not in inspect.signature(nn.Module.load_state_dict).parameters,
                    reason="load_state_dict(assign=True) is torch 2.1+")
def test_assign_true_writes_the_master_and_keeps_the_parameter_the_optimizer_steps():
    model, opt = trained()
    params = list(model.parameters())
    sd = fp32_weights(4)
    model.load_state_dict(sd, assign=True)
    assert all(p is q for p, q in zip(model.parameters(), params))
    assert_masters_are(opt, model, sd)
    train(model, opt, batches(1))  # the step still updates what the model computes with


@pytest.mark.skipif(not (torch.cuda.is_available() and stowage.using_cuda()),
                    reason="needs a CUDA GPU and a libstowage using CUDA")
def test_on_cuda_a_cpu_checkpoint_loaded_into_the_model_becomes_the_master():
    model = make_model(device="cuda")
    opt = apply(model, torch.optim.AdamW(model.parameters(), lr=1e-2)).optimizer
    train(model, opt, batches(2, device="cuda"))
    sd = fp32_weights(5)  # on the CPU, as torch.load(map_location="cpu") gives it
    model.load_state_dict(sd)
    assert_masters_are(opt, model, sd)
    before = masters(opt, model)
    model.load_state_dict(model.state_dict())
    assert all(torch.equal(bits(opt.master(p)), bits(before[n])) for n, p in model.named_parameters())
    train(model, opt, batches(1, device="cuda"))
