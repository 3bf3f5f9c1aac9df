"""What a client writing from docs/pytorch.md alone relies on: the optimizer given to apply() is
replaced (its step refused, an LR scheduler made on it before apply() drives the new one), a
technique applied twice to the same modules is refused, apply()'s options are type-checked, every
refusal is a stowage.StowageError, bool through DLPack, the handles' statistics reset."""
import math
import warnings

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import stowage  # noqa: E402
from stowage import InvalidArgumentError, UnsupportedError, precision  # noqa: E402
from stowage.torch.adaptor import apply  # noqa: E402
from stowage.torch.optim import SharedStorageAdamW  # noqa: E402
from stowage.torch.recompute import recompute_activations  # noqa: E402
from stowage.torch.swap import swap_activations  # noqa: E402
from optim_training import batches, bits, make_model, train  # noqa: E402

REPLACED = (r"this AdamW was replaced by the SharedStorageAdamW that stowage\.torch\.adaptor\.apply\(\) returned "
            r"\(Applied\.optimizer\): its parameters are bf16 views of that optimizer's planes, which hold the fp32 "
            r"masters and the state\. Use that optimizer instead \(step it, save and load its state_dict\(\), make "
            r"LR schedulers and checkpointing helpers on it\)$")


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))


def masters(opt, model):
    return [bits(opt.master(p)) for p in model.parameters()]


def forwards(model):
    return {name: m.__dict__.get("forward") for name, m in model.named_modules()}


# --- F1: the optimizer given to apply() ---

def test_the_optimizer_given_to_apply_refuses_to_step_and_the_masters_stay():
    m = mlp()
    old = torch.optim.AdamW(m.parameters(), lr=1e-2)
    new = apply(m, old).optimizer
    m(torch.randn(4, 16).bfloat16()).float().sum().backward()
    before = masters(new, m)
    with pytest.raises(InvalidArgumentError, match=r"^step\(\): " + REPLACED):
        old.step()
    assert all(torch.equal(a, b) for a, b in zip(before, masters(new, m)))
    with pytest.raises(InvalidArgumentError, match=r"^state_dict\(\): " + REPLACED):
        old.state_dict()
    with pytest.raises(InvalidArgumentError, match=r"^load_state_dict\(\): " + REPLACED):
        old.load_state_dict(new.state_dict())
    with pytest.raises(InvalidArgumentError, match=r"^add_param_group\(\): " + REPLACED):
        old.add_param_group({"params": [nn.Parameter(torch.zeros(2))]})
    with pytest.raises(InvalidArgumentError, match=r"^apply\(\): " + REPLACED):
        apply(m, old, shared_storage=False, recompute=True)
    assert all("forward" not in mod.__dict__ for mod in m.modules())
    # A scheduler made on it afterwards wraps the refusing step and still reaches the refusal.
    torch.optim.lr_scheduler.StepLR(old, step_size=1)
    with pytest.raises(InvalidArgumentError, match=r"^step\(\): " + REPLACED):
        old.step()
    assert old.param_groups is new.param_groups and not old.state
    new.step()  # the new one steps
    assert not all(torch.equal(a, b) for a, b in zip(before, masters(new, m)))
    old.zero_grad(set_to_none=True)  # the same parameters: still fine
    assert all(p.grad is None for p in m.parameters())


def test_a_model_and_its_optimizers_dropped_after_apply_are_freed_without_the_cyclic_collector():
    # The replaced optimizer lists the parameters, bf16 views of the planes: a reference cycle
    # through it kept the planes (4 B a parameter on the device) until Python's collector ran.
    import gc
    import weakref
    m = mlp()
    old = torch.optim.AdamW(m.parameters(), lr=1e-2)
    applied = apply(m, old)
    step = old.step  # the refusal itself, held
    torch.optim.lr_scheduler.StepLR(old, step_size=1)  # wraps the retired step through __func__
    m(torch.randn(4, 16).bfloat16()).float().sum().backward()
    applied.optimizer.step()
    # The parameters are the last holders of the planes' storage, with the optimizer's buckets.
    refs = [weakref.ref(o) for o in [m, old, applied.optimizer, *m.parameters()]]
    enabled = gc.isenabled()
    gc.disable()
    try:
        del m, old, applied
        assert [r() is None for r in refs] == [True] * len(refs)
    finally:
        if enabled:
            gc.enable()
    with pytest.raises(InvalidArgumentError, match=r"^step\(\): the optimizer it belongs to was replaced by "
                                                   r"stowage\.torch\.adaptor\.apply\(\) and is gone$"):
        step()


def test_a_copy_or_pickle_of_the_replaced_optimizer_is_refused():
    # torch.optim.Optimizer's __getstate__ keeps param_groups only: a copy would lose the refusals
    # and step copies of the bf16 views as fp32 weights.
    import copy
    import pickle
    m = mlp()
    old = torch.optim.AdamW(m.parameters(), lr=1e-2)
    applied = apply(m, old)
    assert isinstance(old, torch.optim.AdamW) and type(old).__name__ == "AdamW"
    with pytest.raises(InvalidArgumentError, match=r"^copy\.deepcopy\(\) or pickle: " + REPLACED):
        copy.deepcopy(old)
    with pytest.raises(InvalidArgumentError, match=r"^copy\.deepcopy\(\) or pickle: " + REPLACED):
        pickle.dumps(old)
    torch.optim.lr_scheduler.StepLR(old, step_size=1)  # a scheduler is still made on it
    with pytest.raises(InvalidArgumentError, match=r"^step\(\): " + REPLACED):
        old.step()
    assert applied.optimizer.param_groups is old.param_groups


@pytest.mark.parametrize("given, decoupled", [({"decoupled": True}, True), ({"decoupled": False}, False),
                                              ({"decoupled": True, "decoupled_weight_decay": False}, None)])
def test_an_adam_groups_own_decoupled_is_read_and_an_unlike_pair_refused(given, decoupled):
    m = mlp()
    adam = torch.optim.Adam(m.parameters(), lr=1e-2, weight_decay=0.1)
    adam.param_groups[0].update(given)
    if decoupled is None:
        with pytest.raises(InvalidArgumentError, match=r"^shared storage: a group's decoupled=True and "
                                                       r"decoupled_weight_decay=False disagree$"):
            apply(m, adam)
        assert all(p.dtype == torch.float32 for p in m.parameters()) and "step" not in adam.__dict__
        return
    assert apply(m, adam).optimizer.param_groups[0]["decoupled"] is decoupled


def test_a_refused_apply_leaves_the_optimizer_steppable_and_the_model_fp32():
    m = mlp()
    old = torch.optim.AdamW(m.parameters(), lr=1e-2, amsgrad=True)
    with pytest.raises(UnsupportedError, match="amsgrad is not supported"):
        apply(m, old, recompute=True)
    assert all(p.dtype == torch.float32 for p in m.parameters())
    assert all("forward" not in mod.__dict__ for mod in m.modules())
    assert not any(k in old.__dict__ for k in ("step", "state_dict", "_stowage_replaced_by"))
    w = m[0].weight.detach().clone()
    m(torch.randn(4, 16)).sum().backward()
    old.step()
    assert not torch.equal(w, m[0].weight) and old.state[m[0].weight]["exp_avg"].dtype == torch.float32


@pytest.mark.parametrize("kind, missing", [(torch.optim.AdamW, "exp_avg_sq"), (torch.optim.Adam, "exp_avg")])
def test_an_incomplete_resumed_state_is_refused_before_any_parameter_moves(kind, missing):
    """A resumed state entry without one of AdamW's moments was refused only by the new optimizer's
    load_state_dict(), after the parameters had become bf16 views (their low bits gone)."""
    m = mlp()
    before = [(p, bits(p).clone()) for p in m.parameters()]
    old = kind(m.parameters(), lr=1e-2)
    w = m[0].weight
    entry = {"step": torch.tensor(3.0), "exp_avg": torch.ones_like(w), "exp_avg_sq": torch.ones_like(w)}
    del entry[missing]
    saved = dict(entry)
    old.state[w] = entry
    groups = [dict(g) for g in old.param_groups]
    with pytest.raises(InvalidArgumentError, match=f"^load_state_dict\\(\\): the state has no {missing}$"):
        apply(m, old, recompute=True)
    assert [(p, p.dtype) for p in m.parameters()] == [(p, torch.float32) for p, _ in before]
    assert all(torch.equal(bits(p), b) for p, b in before)
    assert all("forward" not in mod.__dict__ for mod in m.modules())
    assert type(old) is kind and not any(k in old.__dict__ for k in ("step", "state_dict", "_stowage_replaced_by"))
    assert list(old.state) == [w] and old.state[w] is entry and entry.keys() == saved.keys()
    assert all(entry[k] is v for k, v in saved.items()) and old.param_groups == groups


def run_with_scheduler(made_before):
    model = make_model()
    base = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if made_before:
        sched = torch.optim.lr_scheduler.StepLR(base, step_size=1, gamma=0.5)
        opt = apply(model, base).optimizer
    else:
        opt = apply(model, base).optimizer
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    losses, lrs = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in batches(4):
            losses += train(model, opt, [(x, y)])
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
    return losses, lrs, masters(opt, model), [str(w.message) for w in caught]


def test_an_lr_scheduler_made_before_apply_drives_the_optimizer_apply_returned():
    losses, lrs, final, said = run_with_scheduler(made_before=False)
    assert lrs == [1e-2 * 0.5 ** k for k in range(1, 5)] and said == []
    losses_b, lrs_b, final_b, said_b = run_with_scheduler(made_before=True)
    assert lrs_b == lrs and losses_b == losses
    assert all(torch.equal(a, b) for a, b in zip(final, final_b))
    # torch's own warning, once: the step it wrapped was replaced after the scheduler was made.
    assert len(said_b) == 1 and "`optimizer.step()` has been overridden after learning rate scheduler" in said_b[0]


# --- F2: a technique applied twice ---

class Attention(nn.Module):
    def __init__(self, h=16):
        super().__init__()
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        return self.proj((q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1) @ v)


class Block(nn.Module):
    def __init__(self, h=16):
        super().__init__()
        self.attn, self.fc1, self.act, self.fc2 = Attention(h), nn.Linear(h, 32), nn.GELU(), nn.Linear(32, h)

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.fc2(self.act(self.fc1(x)))


def blocks():
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block())


def step_without_warnings(model):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.randn(2, 8, 16, requires_grad=True)).square().sum().backward()


@pytest.mark.parametrize("technique", ["recompute_activations", "swap_activations", "apply"])
def test_a_technique_applied_twice_to_the_same_modules_is_refused_until_the_first_is_removed(technique):
    model = blocks()
    make = {"recompute_activations": lambda: recompute_activations(model),
            "swap_activations": lambda: swap_activations(model),
            "apply": lambda: apply(model, torch.optim.SGD(model.parameters(), lr=0.1), shared_storage=False,
                                   recompute=True)}[technique]
    first = make()
    before = forwards(model)
    if technique == "swap_activations":
        message = (r"^swap_activations: 0\.attn is already swapped by an earlier handle "
                   r"\(swap_activations\(\) or apply\(swap=True\)\) that was not removed; remove\(\) that "
                   r"handle first$")
    else:
        message = (r"^recompute_activations: 0\.act is already recomputed by an earlier handle "
                   r"\(recompute_activations\(\) or apply\(recompute=True\)\) that was not removed; remove\(\) that "
                   r"handle first$")
    with pytest.raises(InvalidArgumentError, match=message):
        make()
    assert forwards(model) == before  # nothing wrapped
    step_without_warnings(model)  # the first handle does the work, and backward does not warn
    stats = (first.recompute if technique == "apply" else first).stats
    if technique == "swap_activations":
        assert stats.swapped > 0 and stats.bytes_to_host > 0
    else:
        assert stats.activations_released == 2 and stats.recomputations == 2
    first.remove()
    second = make()  # once the first is removed
    step_without_warnings(model)
    second.remove()
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("first_names, second_names, where", [
    (["0"], ["0.attn"], r"0\.attn is inside 0, which is"),
    (["0.attn"], ["0"], r"0 is around 0\.attn, which is"),
])
def test_swapping_a_module_inside_or_around_one_already_swapped_is_refused(first_names, second_names, where):
    # The two handles' saved-tensor hooks would nest: only the inner pair packs, the other handle
    # would swap and count nothing.
    model = blocks()
    first = swap_activations(model, names=first_names)
    before = forwards(model)
    with pytest.raises(InvalidArgumentError, match=rf"^swap_activations: {where} already swapped by an earlier "
                                                   r"handle"):
        swap_activations(model, names=second_names)
    assert forwards(model) == before
    first.remove()
    second = swap_activations(model, names=second_names)
    second.remove()


@pytest.mark.parametrize("given, names, where", [
    (lambda model: model[0], ["attn"], r"attn is inside the module given, which is"),
    (lambda model: model[0].attn, (), r"the module given is inside a Block above it, which is"),
    (lambda model: model[0].attn, ["qkv"], r"qkv is inside a Block above the module given, which is"),
])
def test_swapping_inside_a_module_swapped_at_or_above_the_module_given_is_refused(given, names, where):
    # A module has no parent link: the block an earlier handle swaps is the module given, or above it.
    model = blocks()
    first = swap_activations(model, names=["0"])
    before = forwards(model)
    with pytest.raises(InvalidArgumentError, match=rf"^swap_activations: {where} already swapped by an earlier "
                                                   r"handle"):
        swap_activations(given(model), names=names)
    assert forwards(model) == before
    first.remove()
    second = swap_activations(given(model), names=names)  # once the first is removed
    second.remove()


def test_hyper_parameters_a_scheduler_set_are_checked_for_every_group_before_any_is_stepped():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    opt = SharedStorageAdamW([{"params": m[0].parameters()}, {"params": m[1].parameters()}], lr=1e-2)
    m(torch.randn(2, 4).bfloat16()).float().sum().backward()
    masters = [opt.master(p).clone() for p in m.parameters()]
    for bad in (math.inf, math.nan, -1.0):
        opt.param_groups[1]["lr"] = bad
        with pytest.raises(InvalidArgumentError, match=r"^step\(\): param group 1: invalid AdamW hyper-parameters"):
            opt.step()
        assert all(torch.equal(opt.master(p), w) for p, w in zip(m.parameters(), masters))  # group 0 untouched
        assert not opt.state  # no step counted anywhere
    opt.param_groups[1]["lr"] = 1e-2
    opt.param_groups[0]["betas"] = (0.9, 1.0)
    with pytest.raises(InvalidArgumentError, match=r"^step\(\): param group 0: invalid AdamW hyper-parameters"):
        opt.step()
    with pytest.raises(InvalidArgumentError, match=r"^SharedStorageAdamW\(\): invalid AdamW hyper-parameters"):
        SharedStorageAdamW(nn.Linear(2, 2).parameters(), lr=math.inf)
    with pytest.raises(InvalidArgumentError, match=r"^add_param_group\(\): invalid AdamW hyper-parameters"):
        opt.add_param_group({"params": nn.Linear(2, 2).parameters(), "eps": -1.0})
    # Checked as the float32 kernels take them: 1 - 1e-8 is 1.0 in float32, so a group with it
    # would be refused by the kernel after the others were stepped.
    with pytest.raises(InvalidArgumentError, match=r"^add_param_group\(\): invalid AdamW hyper-parameters"):
        opt.add_param_group({"params": nn.Linear(2, 2).parameters(), "betas": (0.9, 0.99999999)})
    # A one-element tensor lr, as torch.optim takes it, is its value.
    opt.param_groups[0]["betas"] = (0.9, 0.999)
    opt.param_groups[1]["lr"] = torch.tensor(1e-2)
    opt.step()
    assert int(opt.state[next(m.parameters())]["step"]) == 1


def test_other_techniques_and_other_modules_still_stack():
    model = blocks()
    recompute = recompute_activations(model, activation_types=(), names=["0.act"])
    more = recompute_activations(model, activation_types=(), names=["1.act"])  # another activation
    swap = swap_activations(model)  # another technique
    step_without_warnings(model)
    assert recompute.stats.activations_released == 1 and more.stats.activations_released == 1
    assert swap.stats.swapped > 0
    for handle in (swap, more, recompute):
        handle.remove()


# --- F3, F4: every refusal a StowageError; options' types ---

def test_a_misspelt_rounding_is_an_invalid_argument_error():
    m = mlp()
    opt = torch.optim.AdamW(m.parameters())
    with pytest.raises(InvalidArgumentError, match=r"^apply\(\): rounding must be 'nearest_even' or 'half_up' "
                                                   r"\(got 'nearest'\)$"):
        apply(m, opt, rounding="nearest")
    assert all(p.dtype == torch.float32 for p in m.parameters()) and "step" not in opt.__dict__
    for bad in ("nearest", ["nearest_even"], None):
        with pytest.raises(InvalidArgumentError, match=f"^rounding {bad!r} is neither 'half_up' nor 'nearest_even'$"
                           .replace("[", r"\[").replace("]", r"\]")):
            SharedStorageAdamW(mlp().parameters(), rounding=bad)
    with pytest.raises(InvalidArgumentError, match="^grad_bits 8 is neither 32"):
        precision.any_nonfinite(0, 8, 0)


def test_the_packages_other_value_errors_are_stowage_errors():
    with pytest.raises(InvalidArgumentError, match="^set_memory_cap: -1 is negative$"):
        stowage.set_memory_cap(-1)
    from stowage.torch import demo
    with pytest.raises(InvalidArgumentError, match="^config 'zero3' is not one of"):
        demo.run("zero3")


BAD_OPTIONS = [
    ("recompute", "yes", "recompute must be True or False (got 'yes')"),
    ("swap", 1, "swap must be True or False (got 1)"),
    ("shared_storage", None, "shared_storage must be True or False (got None)"),
    ("skip_nonfinite", "no", "skip_nonfinite must be True or False (got 'no')"),
    ("max_grad_norm", "1", "max_grad_norm must be a number > 0 or None (got '1')"),
    ("max_grad_norm", True, "max_grad_norm must be a number > 0 or None (got True)"),
    ("max_grad_norm", float("nan"), "max_grad_norm must be a number > 0 or None (got nan)"),
    ("swap_prefetch", "1", "swap_prefetch must be an int >= 0 (got '1')"),
    ("swap_prefetch", True, "swap_prefetch must be an int >= 0 (got True)"),
    ("swap_prefetch", 1.0, "swap_prefetch must be an int >= 0 (got 1.0)"),
    ("recompute_activation_types", nn.GELU, "recompute_activation_types must be a list or tuple of module classes, "
     "e.g. (torch.nn.GELU, torch.nn.SiLU) (got <class 'torch.nn.modules.activation.GELU'>)"),
    ("recompute_names", "1", "recompute_names must be a list or tuple of module names (str), e.g. "
     "[\"layers.0.mlp.act\"] (got '1')"),
    ("swap_names", [0], "swap_names must be a list or tuple of module names (str), e.g. "
     "[\"layers.0.mlp.act\"] (got [0])"),
]


@pytest.mark.parametrize("option,value,message", BAD_OPTIONS, ids=[f"{o}={v!r}" for o, v, _ in BAD_OPTIONS])
def test_options_of_the_wrong_type_are_refused_by_name_before_anything_changes(option, value, message):
    m = mlp()
    opt = torch.optim.AdamW(m.parameters())
    with pytest.raises(InvalidArgumentError) as refused:
        apply(m, opt, **{option: value})
    assert str(refused.value) == "apply(): " + message
    assert all(p.dtype == torch.float32 for p in m.parameters())
    assert all("forward" not in mod.__dict__ for mod in m.modules()) and "step" not in opt.__dict__


@pytest.mark.parametrize("make,message", [
    (lambda ps: SharedStorageAdamW(ps, max_grad_norm="1"), "max_grad_norm must be a number > 0 or None (got '1')"),
    (lambda ps: SharedStorageAdamW(ps, loss_scale="2"), "loss_scale must be a finite number > 0 (got '2')"),
    (lambda ps: SharedStorageAdamW(ps, skip_nonfinite=1), "skip_nonfinite must be True or False (got 1)"),
], ids=["max_grad_norm", "loss_scale", "skip_nonfinite"])
def test_the_optimizers_own_options_are_type_checked(make, message):
    m = mlp()
    with pytest.raises(InvalidArgumentError) as refused:
        make(m.parameters())
    assert str(refused.value) == message and all(p.dtype == torch.float32 for p in m.parameters())


def test_the_module_techniques_check_their_own_options():
    model = blocks()
    with pytest.raises(InvalidArgumentError, match=r"^recompute_activations: names must be a list or tuple of "
                                                   r"module names \(str\)"):
        recompute_activations(model, names="0.act")
    with pytest.raises(InvalidArgumentError, match=r"^recompute_activations: activation_types must be a list or "
                                                   r"tuple of module classes"):
        recompute_activations(model, activation_types=nn.GELU)
    with pytest.raises(InvalidArgumentError, match=r"^swap_activations: prefetch must be an int >= 0 \(got True\)$"):
        swap_activations(model, prefetch=True)
    with pytest.raises(InvalidArgumentError, match=r"^swap_activations: names must be a list or tuple"):
        swap_activations(model, names="0.attn")
    assert all("forward" not in m.__dict__ for m in model.modules())


# --- F5: bool through DLPack ---

def torch_version():
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in torch.__version__.split(".")[:2])


@pytest.mark.skipif(stowage.using_cuda(), reason="reads device memory from the host")
def test_bool_reaches_a_torch_without_kdlbool_as_a_uint8_buffer_viewed_as_bool():
    if torch_version() < (2, 0):  # DLPack's kDLBool (code 6) is newer than this torch's reader
        with pytest.raises(RuntimeError, match="Unsupported code 6"):
            torch.from_dlpack(stowage.empty((3,), "bool"))
    buf = stowage.empty((3,), "uint8")
    t = torch.from_dlpack(buf).view(torch.bool)  # no copy
    assert t.dtype == torch.bool and t.data_ptr() == buf.data_ptr
    t.copy_(torch.tensor([True, False, True]))
    assert t.view(torch.uint8).tolist() == [1, 0, 1]


# --- F6: the handles' statistics ---

def test_the_handles_statistics_reset_through_stats():
    model = blocks()
    recompute, swap = recompute_activations(model), swap_activations(model)
    step_without_warnings(model)
    assert not hasattr(recompute, "reset") and not hasattr(swap, "reset")
    assert recompute.stats.recomputations == 2 and swap.stats.bytes_to_host > 0
    recompute.stats.reset()
    swap.stats.reset()
    assert (recompute.stats.bytes_released, recompute.stats.activations_released) == (0, 0)
    assert recompute.stats.recomputations == 2  # counted since creation
    assert (swap.stats.bytes_to_host, swap.stats.bytes_to_device, swap.stats.swapped) == (0, 0, 0)
    swap.remove()
    recompute.remove()
