"""apply() under the training loops people write, round three: an LR scheduler over streamed
state, a param group added after apply() (unfreezing), Hugging Face's nested *Attention modules,
a refused Applied.remove(), apply() given the optimizer an earlier apply() made, nn.DataParallel's
replication. Numbers held bit for bit against the same loop without the technique."""
import math

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from stowage import InvalidArgumentError  # noqa: E402
from stowage.torch.adaptor import apply  # noqa: E402
from stowage.torch.optim import SharedStorageAdamW  # noqa: E402
from stowage.torch.swap import swap_activations  # noqa: E402
from optim_training import batches, bits, make_model, train  # noqa: E402
from pickling import loaded_without_stowage  # noqa: E402


def test_an_lr_scheduler_drives_streamed_state_as_it_drives_state_on_the_device():
    """torch's schedulers set optimizer._step_count (an int, their count of steps) on the optimizer:
    the streamed step must not look anything of its own up under that name."""
    runs = []
    for placement in ("none", "streamed"):
        model = make_model()
        opt = apply(model, torch.optim.AdamW(model.parameters(), lr=1e-2), state_offload=placement).optimizer
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        losses = []
        for x, y in batches(5):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
        assert opt.param_groups[0]["lr"] == 1e-2 * 0.5 ** 2
        runs.append((losses, [bits(opt.master(p)) for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


@pytest.mark.parametrize("make", [lambda ps: torch.optim.AdamW(ps, lr=3e-4, betas=(0.8, 0.95), weight_decay=0.1),
                                  lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True)],
                         ids=["adamw", "sgd"])
def test_a_group_added_after_apply_takes_the_users_defaults_as_torch_gives_them(make):
    def parts():
        torch.manual_seed(0)
        return nn.Linear(4, 4), nn.Linear(4, 2)

    body, head = parts()
    plain = make(list(body.parameters()))
    plain.add_param_group({"params": list(head.parameters())})
    body, head = parts()
    opt = apply(body, make(list(body.parameters()))).optimizer  # the head joins later (unfreezing)
    opt.add_param_group({"params": list(head.parameters())})
    switches = ("amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused")
    want = {k: v for k, v in plain.param_groups[1].items() if k != "params" and k not in switches}
    got = {k: v for k, v in opt.param_groups[1].items() if k not in ("params", "decoupled")}
    assert got == want
    assert opt.defaults["lr"] == plain.defaults["lr"]


class SelfAttention(nn.Module):
    def __init__(self, h=16, heads=2):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(h, 3 * h), nn.Linear(h, h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        p = (q @ k.transpose(-2, -1) / math.sqrt(h // self.heads)).softmax(-1)
        return self.proj((p @ v).transpose(1, 2).reshape(b, s, h))


class OuterAttention(nn.Module):  # as Hugging Face's BertAttention around BertSelfAttention
    def __init__(self, h=16):
        super().__init__()
        self.self, self.dense, self.ln = SelfAttention(h), nn.Linear(h, h), nn.LayerNorm(h)

    def forward(self, x):
        return self.ln(x + self.dense(self.self(x)))


def nested(layers=4):
    torch.manual_seed(0)
    return nn.Sequential(*[OuterAttention() for _ in range(layers)])


def test_nested_attention_modules_swap_the_outermost_so_prefetch_brings_back_the_right_calls():
    x = torch.randn(2, 8, 16, requires_grad=True)
    base = nested()
    base(x).square().sum().backward()
    model = nested()
    handle = swap_activations(model, prefetch=1)
    assert handle.modules == ["0", "1", "2", "3"]
    model(x).square().sum().backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), base.parameters()))
    s = handle.stats
    # Backward reaches the last call first: only its tensors come back on demand.
    assert s.swapped % 4 == 0 and s.on_demand == s.swapped // 4 and s.prefetched == s.swapped - s.on_demand
    # Named, a module inside another named one is refused (nothing wrapped).
    with pytest.raises(InvalidArgumentError, match="'0.self' is inside '0', which is named too"):
        swap_activations(model, names=["0", "0.self"])
    handle.remove()
    assert all("forward" not in m.__dict__ for m in model.modules())


class Block(nn.Module):
    def __init__(self, h=16):
        super().__init__()
        self.attn, self.fc1, self.act, self.fc2 = SelfAttention(h), nn.Linear(h, 32), nn.GELU(), nn.Linear(32, h)

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.fc2(self.act(self.fc1(x)))


def test_a_refused_applied_remove_undoes_nothing():
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    applied = apply(model, torch.optim.SGD(model.parameters(), lr=0.1), shared_storage=False, recompute=True,
                    swap=True)
    later = swap_activations(model[0], names=("fc1",))  # made after apply's handles, over the same modules

    def forwards():
        return {name: m.__dict__.get("forward") for name, m in model.named_modules()}

    before = forwards()
    with pytest.raises(InvalidArgumentError, match="reverse order"):
        applied.remove()
    assert forwards() == before and applied.swap is not None and applied.recompute is not None
    later.remove()
    applied.remove()
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_apply_given_the_optimizer_an_earlier_apply_made_says_to_leave_shared_storage_out():
    model = make_model()
    opt = apply(model, torch.optim.AdamW(model.parameters())).optimizer
    with pytest.raises(InvalidArgumentError, match="already a SharedStorageAdamW .*shared_storage=False"):
        apply(model, opt, recompute=True)
    assert all("forward" not in m.__dict__ for m in model.modules())
    applied = apply(model, opt, shared_storage=False, recompute=True)
    assert applied.optimizer is opt and isinstance(opt, SharedStorageAdamW)
    assert train(model, opt, batches(2))  # trains on
    applied.remove()


def replicate_each(model):
    """What nn.parallel.replicate (nn.DataParallel on several devices) asks of every module; the
    rest of it needs CUDA devices."""
    return [m._replicate_for_data_parallel() for m in model.modules()]


def replica_of(network, scale):
    """nn.parallel.replicate's wiring of one replica (torch 1.13's), on the CPU: each module's
    replica, its children the children's replicas, its parameters the original's times `scale`
    (standing in for the broadcast to another device)."""
    modules = list(network.modules())
    index = {id(m): i for i, m in enumerate(modules)}
    copies = replicate_each(network)
    for m, r in zip(modules, copies):
        for k, child in m._modules.items():
            r._modules[k] = None if child is None else copies[index[id(child)]]
        for k, p in m._parameters.items():
            setattr(r, k, None if p is None else p.detach() * scale)
    return copies[0]


def test_data_parallel_replication_of_a_wrapped_model_is_refused_and_a_copy_or_removal_replicates():
    """A replica copies its module's __dict__, wrapped forward included: it would run the original's
    technique on the original's weights. Refused at replication; a deep copy's replicas (an EMA
    model's) run on their own weights."""
    import copy
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    applied = apply(model, torch.optim.SGD(model.parameters(), lr=0.1), shared_storage=False, recompute=True,
                    swap=True)
    wrapped = [name for name, m in model.named_modules() if "forward" in m.__dict__]
    refusing = [name for name, m in model.named_modules() if "_replicate_for_data_parallel" in m.__dict__]
    assert refusing == wrapped and {"0.attn", "0.act", "1.attn", "1.act"} <= set(wrapped)
    with pytest.raises(InvalidArgumentError, match="nn.DataParallel cannot replicate a Sequential whose forward a "
                                                   "stowage technique wrapped.*DistributedDataParallel"):
        replicate_each(model)
    for name in refusing:
        with pytest.raises(InvalidArgumentError, match="cannot replicate"):
            model.get_submodule(name)._replicate_for_data_parallel()
    x = torch.randn(2, 8, 16)
    with torch.no_grad():
        # Without device ids (a CPU-only machine) DataParallel calls the model: nothing to refuse. (With
        # one GPU it would move the model there first.)
        if not torch.cuda.is_available():
            assert torch.equal(nn.DataParallel(model)(x), model(x))
        twin = copy.deepcopy(model)
        zero = replica_of(twin, 0.0)  # runs on its own (zero) weights, not the copy's
        assert torch.equal(zero(x), replica_of(copy.deepcopy(nn.Sequential(Block(), Block())), 0.0)(x))
        assert not torch.equal(zero(x), twin(x))
        assert torch.equal(replica_of(twin, 1.0)(x), twin(x))
        assert all("forward" not in m.__dict__ for m in zero.modules())
        twin2 = copy.deepcopy(twin)  # a copy of a copy replicates the same way
        assert torch.equal(replica_of(twin2, 0.0)(x), zero(x))
    # A pickle loads without stowage (the forwards are bound methods then; docs/pytorch.md).
    loaded = loaded_without_stowage(model)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    with pytest.raises(InvalidArgumentError, match="cannot replicate"):
        replicate_each(model)  # the original still refuses
    applied.remove()
    assert all("forward" not in m.__dict__ and "_replicate_for_data_parallel" not in m.__dict__
               for m in model.modules())
    with torch.no_grad():
        assert torch.equal(replica_of(model, 0.0)(x), zero(x))
