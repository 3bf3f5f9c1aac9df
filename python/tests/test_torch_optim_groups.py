"""The shared-storage optimizers' param groups and arguments as torch.optim takes them: a refused
constructor, add_param_group() or apply() leaves every parameter as it was (a moved parameter has
lost its fp32 low bits), a parameter is listed once, the group dicts given are the groups kept,
and positional arguments mean what they mean to torch.optim.AdamW and SGD."""
import pytest

torch = pytest.importorskip("torch")

from stowage import InvalidArgumentError  # noqa: E402
from stowage.torch.adaptor import apply  # noqa: E402
from stowage.torch.optim import SharedStorageAdamW, SharedStorageSGD  # noqa: E402
from optim_training import batches, bits, make_model, train  # noqa: E402


def fp32_bits(model):
    return {name: bits(p).clone() for name, p in model.named_parameters()}


def assert_unchanged(model, before):
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(bits(p), before[name]), name


@pytest.mark.parametrize("make, bad", [
    (lambda groups: SharedStorageAdamW(groups, lr=1e-3), {"lr": -1.0}),
    (lambda groups: SharedStorageAdamW(groups, lr=1e-3), {"betas": (0.9, 1 - 1e-8)}),  # 1.0 in fp32
    (lambda groups: SharedStorageSGD(groups, lr=0.1), {"nesterov": True}),  # without momentum
], ids=["adamw-lr", "adamw-beta2", "sgd-nesterov"])
def test_a_constructor_refused_for_a_later_group_moves_no_parameter(make, bad):
    model = make_model()
    before = fp32_bits(model)
    groups = [{"params": list(model[0].parameters())}, {"params": list(model[2].parameters()), **bad}]
    with pytest.raises(InvalidArgumentError, match="invalid (AdamW|SGD) hyper-parameters"):
        make(groups)
    assert_unchanged(model, before)
    for key in bad:
        del groups[1][key]
    opt = make(groups)  # the same parameters, once the group is fixed
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert torch.equal(bits(opt.master(model[0].weight)), before["0.weight"])


def test_a_refused_apply_leaves_the_model_and_the_optimizer_as_they_were():
    """torch checks only its defaults: a group whose beta2 rounds to 1 in fp32 reaches the fused
    optimizer, which refused it after the first group had moved (a model half bf16)."""
    model = make_model()
    torch_opt = torch.optim.AdamW([{"params": list(model[0].parameters())},
                                   {"params": list(model[2].parameters()), "betas": (0.9, 1 - 1e-8)}], lr=1e-3)
    before = fp32_bits(model)
    with pytest.raises(InvalidArgumentError, match="invalid AdamW hyper-parameters"):
        apply(model, torch_opt)
    assert_unchanged(model, before)
    x, y = batches(1)[0]
    torch.nn.functional.cross_entropy(model(x), y).backward()
    torch_opt.step()  # still the optimizer to step, over the fp32 model


def test_a_parameter_listed_twice_in_one_group_is_refused_and_nothing_moves():
    p, q, r = (torch.nn.Parameter(torch.randn(4, 4)) for _ in range(3))
    q_bits = bits(q).clone()
    with pytest.raises(InvalidArgumentError, match=r"param group 0: parameter 2 of the param group is parameter 0 "
                                                   "again; list each parameter once"):
        SharedStorageAdamW([p, q, p])
    assert p.dtype == q.dtype == torch.float32
    opt = SharedStorageAdamW([r])
    with pytest.raises(InvalidArgumentError, match=r"add_param_group\(\): parameter 1 of the param group is "
                                                   "parameter 0 again"):
        opt.add_param_group({"params": [q, q]})  # torch.optim only warns; q was moved twice, its master lost
    with pytest.raises(InvalidArgumentError, match="more than one parameter group"):
        opt.add_param_group({"params": [q, r]})
    assert q.dtype == torch.float32 and len(opt.param_groups) == 1
    opt.add_param_group({"params": [q]})
    assert torch.equal(bits(opt.master(q)), q_bits)  # all its fp32 bits


def test_the_group_dicts_given_are_the_groups_kept_as_in_torch_optim():
    model = make_model()
    params = list(model.parameters())
    first = {"params": params[:2], "name": "body"}
    opt = SharedStorageAdamW([first], lr=1e-2, weight_decay=0.0)
    head = {"params": (p for p in params[2:]), "lr": 5e-3}
    opt.add_param_group(head)
    assert opt.param_groups[0] is first and opt.param_groups[1] is head
    assert isinstance(head["params"], list) and head["weight_decay"] == 0.0 and head["decoupled"] is True
    head["lr"] = 0.0  # through the user's own reference, as a freezing loop does it
    before = [bits(opt.master(p)) for p in params]
    train(model, opt, batches(2))
    assert all(torch.equal(b, bits(opt.master(p))) for b, p in zip(before[2:], params[2:]))
    assert not any(torch.equal(b, bits(opt.master(p))) for b, p in zip(before[:2], params[:2]))


def test_positional_arguments_mean_what_they_mean_to_torch_optim():
    m = make_model()
    with pytest.raises(TypeError):  # torch.optim.AdamW's sixth is amsgrad: it was taken as `decoupled`
        SharedStorageAdamW(m.parameters(), 1e-2, (0.9, 0.999), 1e-8, 0.1, False)
    assert all(p.dtype == torch.float32 for p in m.parameters())
    opt = SharedStorageAdamW(m.parameters(), 1e-2, (0.9, 0.98), 1e-6, 0.1, decoupled=False)
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    assert group == {"lr": 1e-2, "betas": (0.9, 0.98), "eps": 1e-6, "weight_decay": 0.1, "decoupled": False}
    sgd_args = (0.1, 0.9, 0.0, 1e-4, True)  # lr, momentum, dampening, weight_decay, nesterov
    ours = SharedStorageSGD(make_model().parameters(), *sgd_args)
    theirs = torch.optim.SGD(make_model().parameters(), *sgd_args)
    assert all(ours.param_groups[0][k] == theirs.param_groups[0][k]
               for k in ("lr", "momentum", "dampening", "weight_decay", "nesterov"))
    with pytest.raises(TypeError):
        SharedStorageSGD(make_model().parameters(), *sgd_args, "half_up")


@pytest.mark.parametrize("kind", [SharedStorageAdamW, SharedStorageSGD])
def test_an_empty_parameter_list_is_refused_as_torch_optim_refuses_it(kind):
    for empty in ([], iter([])):
        with pytest.raises(ValueError, match="optimizer got an empty parameter list"):
            kind(empty)
