"""stowage.torch.adaptor.apply and the shared-storage optimizers as existing training code uses
them: a resumed torch.optim.SGD without momentum, tied weights in master_state_dict(), param
groups with keys of their own and a scheduler that reads them, a model cast or moved after
apply(), and frozen parameters left out of the optimizer. Numbers held bit for bit to
stowage.torch.reference (fp32 masters, a bf16 copy) or to plain torch.optim."""
import copy

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from stowage import InvalidArgumentError, UnsupportedError  # noqa: E402
from stowage.torch.adaptor import apply  # noqa: E402
from stowage.torch.optim import SharedStorageAdamW, SharedStorageSGD  # noqa: E402
from stowage.torch.reference import MasterWeightsOptimizer  # noqa: E402
from optim_training import batches, bits, make_model, train  # noqa: E402

# torch.optim's own switches, which the shared-storage optimizers' groups leave out.
SWITCHES = ("amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused")


def fp32_steps(model, opt, data):
    for x, y in data:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def masters_equal(opt, model, ref):
    return all(torch.equal(bits(opt.master(p)), bits(m)) for p, m in zip(model.parameters(), ref.masters))


# --- 1. SGD without momentum: torch saves {"momentum_buffer": None} ---

def test_apply_resumes_torch_sgd_without_momentum_and_trains_as_the_reference():
    data = batches(6)
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, weight_decay=0.01)
    fp32_steps(model, sgd, data[:2])
    # torch 1.13 keeps {"momentum_buffer": None} per stepped parameter (later versions keep nothing)
    assert all(s.get("momentum_buffer", None) is None for s in sgd.state_dict()["state"].values())
    base = copy.deepcopy(model)  # the fp32 weights torch's steps left
    opt = apply(model, sgd).optimizer
    ref = MasterWeightsOptimizer(base.parameters(), kind="sgd", lr=0.05, weight_decay=0.01)
    assert train(model, opt, data[2:]) == train(base, ref, data[2:])
    assert masters_equal(opt, model, ref)
    assert all(torch.equal(bits(p), bits(q)) for p, q in zip(model.parameters(), base.parameters()))
    saved = opt.state_dict()["state"]
    assert sorted(saved) == [0, 1, 2, 3]
    assert all(s["momentum_buffer"] is None and s.keys() == {"momentum_buffer", "step"} for s in saved.values())


def test_sgd_without_momentum_round_trips_through_torch_sgd_bit_for_bit():
    data = batches(8)
    a = make_model()
    opt_a = SharedStorageSGD(a.parameters(), lr=0.05, weight_decay=0.01)
    train(a, opt_a, data[:3])
    sd = opt_a.state_dict()
    assert [sd["state"][i]["momentum_buffer"] for i in range(4)] == [None] * 4  # as torch.optim.SGD saves it
    assert [float(sd["state"][i]["step"]) for i in range(4)] == [3.0] * 4

    # Into torch.optim.SGD with the fp32 masters: it steps exactly as a fresh torch SGD from those weights.
    fp32 = make_model(seed=5)
    fp32.load_state_dict(opt_a.master_state_dict(a))
    fresh = copy.deepcopy(fp32)
    loaded = torch.optim.SGD(fp32.parameters(), lr=0.05, weight_decay=0.01)
    loaded.load_state_dict(sd)
    fp32_steps(fp32, loaded, data[3:4])
    fp32_steps(fresh, torch.optim.SGD(fresh.parameters(), lr=0.05, weight_decay=0.01), data[3:4])
    assert all(torch.equal(bits(p), bits(q)) for p, q in zip(fp32.parameters(), fresh.parameters()))

    # And back: torch's state dict (momentum_buffer None) and fp32 weights become the master bit for bit,
    # and training goes on as the reference from those weights.
    back = loaded.state_dict()
    assert all(s["momentum_buffer"] is None for s in back["state"].values()) and len(back["state"]) == 4
    c = make_model(seed=3)
    opt_c = SharedStorageSGD(c.parameters(), lr=0.05, weight_decay=0.01)
    opt_c.load_state_dict(back)
    opt_c.load_master_state_dict(c, fp32.state_dict())
    assert all(torch.equal(bits(opt_c.master(p)), bits(q)) for p, q in zip(c.parameters(), fp32.parameters()))
    base = copy.deepcopy(fp32)
    ref = MasterWeightsOptimizer(base.parameters(), kind="sgd", lr=0.05, weight_decay=0.01)
    assert train(c, opt_c, data[4:]) == train(base, ref, data[4:])
    assert masters_equal(opt_c, c, ref)


def test_a_parameter_without_a_momentum_buffer_starts_it_afresh_as_torch_sgd_does():
    # A momentum buffer saved as None (or a count from steps without momentum) with dampening: torch
    # starts the buffer at g, not at (1 - dampening) * g.
    saved = {"state": {0: {"momentum_buffer": None, "step": torch.tensor(3.0)}},
             "param_groups": [dict(lr=0.5, momentum=0.9, dampening=0.5, weight_decay=0.0, nesterov=False, params=[0])]}
    ours, theirs = nn.Parameter(torch.zeros(64)), nn.Parameter(torch.zeros(64))
    opt = SharedStorageSGD([ours], lr=0.5, momentum=0.9, dampening=0.5)
    plain = torch.optim.SGD([theirs], lr=0.5, momentum=0.9, dampening=0.5)
    opt.load_state_dict(copy.deepcopy(saved))
    plain.load_state_dict(copy.deepcopy(saved))
    g = torch.linspace(-1, 1, 64).to(torch.bfloat16)  # exact in bf16 and fp32
    ours.grad, theirs.grad = g, g.float()
    opt.step()
    plain.step()
    assert torch.equal(opt.state[ours]["momentum_buffer"], g.float())
    assert torch.equal(opt.state[ours]["momentum_buffer"], plain.state[theirs]["momentum_buffer"])
    assert torch.equal(bits(opt.master(ours)), bits(theirs))  # -0.5 * g, exact
    assert float(opt.state[ours]["step"]) == 1.0


def test_a_state_without_a_buffer_is_refused_for_adamw_as_torch_would_fail():
    model = make_model()
    opt = SharedStorageAdamW(model.parameters())
    sd = {"state": {0: {"step": torch.tensor(1.0), "exp_avg": None, "exp_avg_sq": torch.zeros(40, 24)}},
          "param_groups": copy.deepcopy(opt.state_dict()["param_groups"])}
    with pytest.raises(InvalidArgumentError, match="exp_avg is not a tensor of shape"):
        opt.load_state_dict(sd)
    assert not opt.state


# --- 2. tied weights in master_state_dict() ---

class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.fc = nn.Embedding(50, 16), nn.Linear(16, 16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight  # as GPT-2

    def forward(self, x):
        return self.head(torch.tanh(self.fc(self.emb(x))))


def lm_train(model, opt, data):
    losses = []
    for x in data:
        opt.zero_grad()
        loss = F.cross_entropy(model(x[:, :-1]).float().reshape(-1, 50), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_master_state_dict_gives_every_key_of_a_tied_weight_the_fp32_master():
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 50, (4, 9), generator=g) for _ in range(6)]
    torch.manual_seed(0)
    model = TiedLM()
    opt = apply(model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)).optimizer
    lm_train(model, opt, data[:3])
    sd = opt.master_state_dict(model)
    assert list(sd) == ["emb.weight", "fc.weight", "fc.bias", "head.weight"]
    for name, p in model.state_dict(keep_vars=True).items():
        assert sd[name].dtype == torch.float32 and torch.equal(bits(sd[name]), bits(opt.master(p))), name
    assert sd["head.weight"] is sd["emb.weight"]  # one tensor, as the tied fp32 model's own state_dict() shares it
    # An fp32 model loads it with the master (not its bf16 rounding) and, with the optimizer's state,
    # training goes on bit for bit.
    torch.manual_seed(7)
    fresh = TiedLM()
    fresh.load_state_dict(sd)
    assert fresh.head.weight is fresh.emb.weight
    assert torch.equal(bits(fresh.emb.weight), bits(opt.master(model.emb.weight)))
    adamw = torch.optim.AdamW(fresh.parameters(), lr=1e-2, weight_decay=0.1)
    adamw.load_state_dict(opt.state_dict())
    opt2 = apply(fresh, adamw).optimizer
    assert lm_train(model, opt, data[3:]) == lm_train(fresh, opt2, data[3:])
    assert all(torch.equal(bits(opt.master(p)), bits(opt2.master(q)))
               for p, q in zip(model.parameters(), fresh.parameters()))


# --- 3. param groups keep their own keys ---

def two_groups(m, **first):
    return [{"params": [m[0].weight, m[2].weight], "name": "decay", "lr_scale": 0.5, **first},
            {"params": [m[0].bias, m[2].bias], "weight_decay": 0.0, "name": "no_decay", "lr_scale": 1.0}]


MAKERS = {"adamw": lambda g: torch.optim.AdamW(g, lr=1e-3, weight_decay=0.1),
          "adam": lambda g: torch.optim.Adam(g, lr=1e-3, weight_decay=0.1),
          "sgd": lambda g: torch.optim.SGD(g, lr=1e-2, momentum=0.9, weight_decay=0.1)}


@pytest.mark.parametrize("resumed", [False, True])
@pytest.mark.parametrize("kind", list(MAKERS))
def test_apply_keeps_every_key_of_the_param_groups(kind, resumed):
    model = make_model()
    base = MAKERS[kind](two_groups(model, initial_lr=1e-3))
    if resumed:
        fp32_steps(model, base, batches(1))
    expected = [{k: v for k, v in g.items() if k not in SWITCHES + ("params",)} for g in base.param_groups]
    if kind != "sgd":
        expected = [{**g, "decoupled": kind == "adamw"} for g in expected]
    params = [g["params"] for g in base.param_groups]
    opt = apply(model, base).optimizer
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == expected
    assert [(g["name"], g["lr_scale"]) for g in opt.param_groups] == [("decay", 0.5), ("no_decay", 1.0)]
    assert opt.param_groups[0]["initial_lr"] == 1e-3 and opt.param_groups[1]["weight_decay"] == 0.0
    assert all(a is b for g, ps in zip(opt.param_groups, params) for a, b in zip(g["params"], ps))
    if resumed:
        assert float(opt.state[model[0].weight]["step"]) == 1.0
    else:
        assert not opt.state


def test_adam_with_decoupled_weight_decay_becomes_the_decoupled_fused_step():
    # Newer torch: Adam(decoupled_weight_decay=True) is AdamW (the group key is set by hand under 1.13).
    data = batches(4)
    ours, base = make_model(), make_model()
    adam = torch.optim.Adam(ours.parameters(), lr=3e-3, weight_decay=0.1)
    adam.param_groups[0]["decoupled_weight_decay"] = True
    opt = apply(ours, adam).optimizer
    # torch's key kept: a state_dict loaded into torch.optim.Adam steps as this one does.
    assert opt.param_groups[0]["decoupled"] is True and opt.param_groups[0]["decoupled_weight_decay"] is True
    ref = MasterWeightsOptimizer(base.parameters(), lr=3e-3, weight_decay=0.1)  # AdamW
    assert train(ours, opt, data) == train(base, ref, data)
    assert masters_equal(opt, ours, ref)


def test_torchs_decoupled_weight_decay_sets_decoupled_when_loaded_or_added_and_a_disagreement_is_refused():
    # Newer torch.optim.Adam/AdamW groups carry decoupled_weight_decay (set by hand under 1.13).
    model = make_model()
    opt = SharedStorageAdamW(list(model.parameters())[:2], lr=1e-3, weight_decay=0.1)
    saved = opt.state_dict()
    saved["param_groups"][0] = {k: v for k, v in saved["param_groups"][0].items() if k != "decoupled"}
    saved["param_groups"][0]["decoupled_weight_decay"] = False  # an Adam checkpoint: L2, not decoupled
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["decoupled"] is False
    opt.add_param_group({"params": list(model.parameters())[2:], "decoupled_weight_decay": True})
    assert opt.param_groups[1]["decoupled"] is True
    before = [bits(opt.master(p)).clone() for p in model.parameters()]
    x, y = batches(1)[0]
    F.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
    opt.param_groups[1]["decoupled"] = False  # now the two keys disagree
    with pytest.raises(InvalidArgumentError, match=r"^step\(\): param group 1: decoupled_weight_decay=True and "
                                                   r"decoupled=False disagree \(the step reads decoupled\): give "
                                                   r"them the same value$"):
        opt.step()
    assert all(torch.equal(bits(opt.master(p)), b) for p, b in zip(model.parameters(), before))  # nothing stepped
    with pytest.raises(InvalidArgumentError, match=r"^add_param_group\(\): decoupled_weight_decay=False and "
                                                   r"decoupled=True disagree"):
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(2))], "decoupled_weight_decay": False,
                             "decoupled": True})


@pytest.mark.parametrize("decoupled", [True, False])
def test_a_saved_adamw_state_says_decoupled_weight_decay_so_newer_torch_adam_steps_it_alike(decoupled):
    # Newer torch.optim.Adam's __setstate__ sets decoupled_weight_decay=False in a group without it.
    model = make_model()
    opt = SharedStorageAdamW(model.parameters(), lr=1e-3, weight_decay=0.1, decoupled=decoupled)
    train(model, opt, batches(1))
    saved = opt.state_dict()
    assert [(g["decoupled"], g["decoupled_weight_decay"]) for g in saved["param_groups"]] == [(decoupled, decoupled)]
    assert "decoupled_weight_decay" not in opt.param_groups[0]  # the optimizer's own groups are as made
    opt.load_state_dict(saved)  # and back: loads and steps
    train(model, opt, batches(1))
    unlike = opt.state_dict()
    unlike["param_groups"][0]["decoupled_weight_decay"] = not decoupled
    before = opt.state_dict()
    with pytest.raises(InvalidArgumentError, match=r"^load_state_dict\(\): param group 0: decoupled_weight_decay and "
                                                   r"decoupled disagree \(the step reads decoupled\)$"):
        opt.load_state_dict(unlike)
    after = opt.state_dict()  # nothing changed
    assert after["param_groups"] == before["param_groups"]
    assert all(torch.equal(a, b) for i in before["state"] for a, b in zip(before["state"][i].values(),
                                                                          after["state"][i].values()))


def test_a_group_added_with_only_decoupled_takes_torchs_key_from_it():
    # apply() on a newer torch.optim.Adam: its defaults carry decoupled_weight_decay=False (set by hand
    # under 1.13); a group that names only `decoupled` is not refused as disagreeing with them.
    model = make_model()
    params = list(model.parameters())
    adam = torch.optim.Adam(params, lr=1e-3, weight_decay=0.1)
    adam.param_groups[0]["decoupled_weight_decay"] = adam.defaults["decoupled_weight_decay"] = False
    opt = apply(model, adam).optimizer
    assert opt.defaults["decoupled"] is False and opt.defaults["decoupled_weight_decay"] is False
    opt.add_param_group({"params": [nn.Parameter(torch.zeros(3))], "decoupled": True})
    assert (opt.param_groups[1]["decoupled"], opt.param_groups[1]["decoupled_weight_decay"]) == (True, True)


_Scheduler = getattr(torch.optim.lr_scheduler, "LRScheduler", None) or torch.optim.lr_scheduler._LRScheduler


class LayerScaled(_Scheduler):
    """Each group's lr: its initial lr times its own lr_scale times factor(step), as layer-wise decay
    schedulers (timm, BEiT) read a key of the group."""

    def __init__(self, optimizer, factor):
        self.factor = factor
        super().__init__(optimizer)

    def get_lr(self):
        return [g["initial_lr"] * g["lr_scale"] * self.factor(self.last_epoch) for g in self.optimizer.param_groups]


def test_a_scheduler_that_reads_a_groups_own_keys_drives_the_fused_step():
    data = batches(6)
    factor = lambda k: 1.0 / (k + 1)  # noqa: E731
    ours, base = make_model(), make_model()
    opt = apply(ours, torch.optim.AdamW(two_groups(ours), lr=4e-3, weight_decay=0.1)).optimizer
    sched = LayerScaled(opt, factor)
    refs = [MasterWeightsOptimizer([base[0].weight, base[2].weight], lr=4e-3, weight_decay=0.1),
            MasterWeightsOptimizer([base[0].bias, base[2].bias], lr=4e-3, weight_decay=0.0)]
    ours_losses, ref_losses = [], []
    for k, (x, y) in enumerate(data):
        opt.zero_grad()
        loss = F.cross_entropy(ours(x.to(torch.bfloat16)).float(), y)
        loss.backward()
        opt.step()
        sched.step()
        ours_losses.append(loss.item())
        for r in refs:
            r.zero_grad()
        loss = F.cross_entropy(base(x.to(torch.bfloat16)).float(), y)
        loss.backward()
        for r, scale in zip(refs, (0.5, 1.0)):
            r.lr = 4e-3 * scale * factor(k)
            r.step()
        ref_losses.append(loss.item())
    assert ours_losses == ref_losses
    assert [g["lr"] for g in opt.param_groups] == [4e-3 * 0.5 * factor(6), 4e-3 * 1.0 * factor(6)]
    ours_params = [ours[0].weight, ours[2].weight, ours[0].bias, ours[2].bias]
    ref_masters = refs[0].masters + refs[1].masters
    assert all(torch.equal(bits(opt.master(p)), bits(m)) for p, m in zip(ours_params, ref_masters))


@pytest.mark.parametrize("switch", ["capturable", "differentiable"])
def test_a_torch_switch_the_fused_step_cannot_honour_is_refused_and_changes_nothing(switch):
    model = make_model()
    adamw = torch.optim.AdamW(model.parameters())
    adamw.param_groups[0][switch] = True
    with pytest.raises(UnsupportedError, match=f"{switch} is not supported"):
        apply(model, adamw)
    assert all(p.dtype == torch.float32 for p in model.parameters())


# --- 4. a parameter cast or moved after apply() ---

def saved_weights(model):
    return {k: v.float() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("move", ["share_memory", "float"])
def test_a_parameter_moved_after_apply_is_refused_before_anything_is_written(move):
    data = batches(3)
    model = make_model()
    opt = apply(model, torch.optim.AdamW(model.parameters(), lr=1e-2)).optimizer
    train(model, opt, data[:2])
    saved = copy.deepcopy(opt.state_dict())
    masters = [bits(opt.master(p)).clone() for p in model.parameters()]
    moments = [bits(opt.state[p][k]).clone() for p in model.parameters() for k in ("exp_avg", "exp_avg_sq")]
    before = model[0].weight.data_ptr()
    getattr(model, move)()
    assert model[0].weight.data_ptr() != before
    x, y = data[2]
    opt.zero_grad()
    F.cross_entropy(model(x.to(model[0].weight.dtype)).float(), y).backward()
    now = "torch.bfloat16" if move == "share_memory" else "torch.float32"
    with pytest.raises(InvalidArgumentError, match=rf"step\(\): parameter '0\.weight' is no longer the bf16 view of "
                                                   rf"its shared-storage plane \(it is {now} \(40, 24\) at "):
        opt.step()
    # Writes through the planes are refused as well; nothing was written, and the master still reads.
    with pytest.raises(InvalidArgumentError, match=r"load_master\(\): parameter '0\.weight' is no longer"):
        opt.load_master(model[0].weight, torch.zeros(40, 24))
    with pytest.raises(InvalidArgumentError, match=r"load_state_dict\(\): parameter '0\.weight' is no longer"):
        opt.load_state_dict(saved)
    with pytest.raises(InvalidArgumentError, match=r"load_master_state_dict\(\): parameter '0\.weight'"):
        opt.load_master_state_dict(model, {k: torch.zeros_like(v) for k, v in saved_weights(model).items()})
    assert all(torch.equal(bits(opt.master(p)), m) for p, m in zip(model.parameters(), masters))
    assert all(torch.equal(bits(opt.state[p][k]), m) for (p, k), m in zip(
        [(p, k) for p in model.parameters() for k in ("exp_avg", "exp_avg_sq")], moments))
    assert [float(opt.state[p]["step"]) for p in model.parameters()] == [2.0] * 4
    if move == "share_memory":  # the storage moved with its contents: the bf16 weights are still the masters'
        assert all(torch.equal(bits(p), bits(opt.master(p).to(torch.bfloat16))) for p in model.parameters())


def test_without_apply_the_moved_parameter_is_named_by_its_group_and_index():
    model = make_model()
    opt = SharedStorageSGD([{"params": [model[0].weight]}, {"params": [model[0].bias, model[2].weight]}], lr=0.1)
    model[2].weight.data = model[2].weight.data.clone()  # same dtype and shape, other memory
    model[2].weight.grad = torch.ones(7, 40, dtype=torch.bfloat16)
    before = bits(opt.master(model[2].weight)).clone()
    with pytest.raises(InvalidArgumentError, match=r"step\(\): parameter 1 of param group 1 is no longer the bf16"):
        opt.step()
    assert torch.equal(bits(opt.master(model[2].weight)), before) and not opt.state


class WithEmpty(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.empty = nn.Linear(24, 7), nn.Parameter(torch.empty(0))

    def forward(self, x):
        return self.fc(x) + self.empty.sum()


def test_an_empty_parameter_passes_the_check_and_trains_as_the_reference():
    # An empty view's address is 0 whatever memory it is in: the check must take it as the view it was given.
    data = batches(3)
    torch.manual_seed(0)
    model = WithEmpty()
    base = copy.deepcopy(model)
    opt = apply(model, torch.optim.AdamW(model.parameters(), lr=1e-2)).optimizer
    ref = MasterWeightsOptimizer(base.parameters(), lr=1e-2)
    assert train(model, opt, data) == train(base, ref, data)
    assert masters_equal(opt, model, ref) and opt.master(model.empty).shape == (0,)


# --- 5. frozen parameters the optimizer does not hold ---

class LoRALinear(nn.Module):
    def __init__(self, i, o, r=2):
        super().__init__()
        self.base, self.A, self.B = nn.Linear(i, o), nn.Linear(i, r, bias=False), nn.Linear(r, o, bias=False)
        self.base.requires_grad_(False)

    def forward(self, x):
        return self.base(x) + self.B(self.A(x))


def lora_model():
    torch.manual_seed(0)
    return nn.Sequential(LoRALinear(24, 40), nn.GELU(), LoRALinear(40, 7))


def module_hooks(model):
    return {name: (sorted(m.__dict__), len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
            for name, m in model.named_modules()}


def test_apply_refuses_frozen_parameters_the_optimizer_does_not_hold_and_changes_nothing():
    model = lora_model()
    params = list(model.parameters())
    values = [bits(p).clone() for p in params]
    hooks = module_hooks(model)
    trainable = [p for p in params if p.requires_grad]
    adamw = torch.optim.AdamW(trainable, lr=1e-3)
    group = dict(adamw.param_groups[0])
    with pytest.raises(InvalidArgumentError, match=r"apply\(\): the optimizer does not hold 4 parameters of the model: "
                                                   r"0\.base\.weight \(float32, requires_grad=False\), 0\.base\.bias "
                                                   r"\(float32, requires_grad=False\), 2\.base\.weight .*2\.base\.bias "
                                                   r".*param group with lr=0.*cast them to torch\.bfloat16"):
        apply(model, adamw, recompute=True)
    assert all(a is b for a, b in zip(model.parameters(), params)) and len(list(model.parameters())) == 8
    assert all(p.dtype == torch.float32 and torch.equal(bits(p), v) for p, v in zip(params, values))
    assert module_hooks(model) == hooks  # no module was wrapped
    assert adamw.param_groups[0] == group and all(a is b for a, b in zip(adamw.param_groups[0]["params"], trainable))
    assert not adamw.state


@pytest.mark.parametrize("pattern", ["lr0_group", "cast_by_user"])
def test_frozen_parameters_given_with_lr0_or_cast_to_bf16_train_as_the_reference(pattern):
    data = batches(4)
    model, base = lora_model(), lora_model()
    frozen = [p for p in model.parameters() if not p.requires_grad]
    frozen_values = [bits(p.to(torch.bfloat16)).clone() for p in frozen]
    trainable = [p for p in model.parameters() if p.requires_grad]
    if pattern == "lr0_group":
        adamw = torch.optim.AdamW([{"params": trainable}, {"params": frozen, "lr": 0.0}], lr=1e-2)
    else:
        for m in (model[0], model[2]):
            m.base.to(torch.bfloat16)
        adamw = torch.optim.AdamW(trainable, lr=1e-2)
    opt = apply(model, adamw).optimizer
    for m in (base[0], base[2]):  # the reference: frozen weights rounded to bf16, the rest with fp32 masters
        m.base.to(torch.bfloat16)
    ref = MasterWeightsOptimizer([p for p in base.parameters() if p.requires_grad], lr=1e-2)
    assert train(model, opt, data) == train(base, ref, data)
    assert all(torch.equal(bits(opt.master(p)), bits(m)) for p, m in zip(trainable, ref.masters))
    assert all(p.dtype == torch.bfloat16 and torch.equal(bits(p), v) for p, v in zip(frozen, frozen_values))
    if pattern == "lr0_group":  # their masters are the fp32 weights, untouched
        assert all(torch.equal(bits(opt.master(p)), bits(q)) for p, q in zip(
            frozen, [q for q in lora_model().parameters() if not q.requires_grad]))
