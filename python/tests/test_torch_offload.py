"""Optimizer-state offload (stowage.torch.offload): m and v (SGD's momentum buffer) mapped or
streamed from host memory, under a device budget; the same numbers bit for bit as state on the
device. On the CPU, "device" is PyTorch's memory and "host" stowage's (an emulated device's), so
PyTorch's own allocator, read through its profiler's memory events, holds exactly the offloaded
bytes less. On a GPU, CUDA parameters and torch.cuda.memory_allocated()."""
import copy
import io

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage import InvalidArgumentError  # noqa: E402
from stowage.torch.adaptor import apply  # noqa: E402
from stowage.torch.optim import SharedStorageAdamW, SharedStorageSGD  # noqa: E402
from optim_training import batches, bits, make_model, train  # noqa: E402

emulated = pytest.mark.skipif(stowage.using_cuda(), reason="the CPU path offloads to stowage's emulated device; "
                                                           "this libstowage uses CUDA")
cuda = pytest.mark.skipif(not (torch.cuda.is_available() and stowage.using_cuda()),
                          reason="needs a CUDA GPU and a libstowage using CUDA")

HYPER = {"adamw": dict(lr=3e-3, weight_decay=0.05, max_grad_norm=0.5),
         "sgd": dict(lr=0.05, momentum=0.9, weight_decay=0.01, max_grad_norm=0.5)}
KINDS = {"adamw": SharedStorageAdamW, "sgd": SharedStorageSGD}
# make_model's parameters: 960, 40, 280 and 7 elements; AdamW keeps 8 bytes of state for each, SGD 4.
STATE = {"adamw": [7680, 320, 2240, 56], "sgd": [3840, 160, 1120, 28]}
# (kind, placement, budget) -> each parameter's placement. Mapped: first fit in order. Streamed:
# the scratch for the largest state (7680 / 3840) comes out of the budget first.
SPLITS = {
    ("adamw", "mapped", None): ["mapped"] * 4,
    ("adamw", "streamed", None): ["streamed"] * 4,
    ("adamw", "mapped", 3000): ["mapped", "device", "device", "device"],
    ("adamw", "streamed", 8000): ["streamed", "device", "streamed", "streamed"],
    ("adamw", "mapped", 10296): ["device"] * 4,  # everything fits: nothing leaves, no scratch
    ("sgd", "mapped", None): ["mapped"] * 4,
    ("sgd", "streamed", None): ["streamed"] * 4,
    ("sgd", "mapped", 1500): ["mapped", "device", "device", "device"],
    ("sgd", "streamed", 4000): ["streamed", "device", "streamed", "streamed"],
}


def states(opt, model):
    return [{k: bits(v) for k, v in opt.state_dict()["state"][i].items() if k != "step"}
            for i, _ in enumerate(model.parameters())]


def same_run(kind, placement, budget, steps=8, device="cpu"):
    """Trains with state on the device and with the given placement; both runs' results."""
    out = []
    for where, b in (("none", None), (placement, budget)):
        model = make_model(device=device)
        opt = KINDS[kind](model.parameters(), state_offload=where, state_device_budget=b, **HYPER[kind])
        losses = train(model, opt, batches(steps, device=device), poison={3})
        out.append((losses, [bits(opt.master(p)) for p in model.parameters()], states(opt, model), model, opt))
    return out


def pytorch_cpu_bytes(fn):
    """Net bytes PyTorch's CPU allocator handed out during fn() and did not get back: its own
    memory events, as its profiler records them."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sum(e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")


def in_stowage_memory(t):
    """True when t's bytes lie in a block stowage's allocator handed out (device 0)."""
    blocks = [b for s in stowage.snapshot(0)["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    return any(b["address"] <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= b["address"] + b["size"]
               for b in blocks)


@emulated
@pytest.mark.parametrize("kind,placement,budget", list(SPLITS))
def test_offloaded_state_gives_the_same_numbers_bit_for_bit(kind, placement, budget):
    (base_losses, base_masters, base_state, _, _), (losses, masters, state, model, opt) = same_run(
        kind, placement, budget)
    assert losses == base_losses
    assert all(torch.equal(a, b) for a, b in zip(masters, base_masters))
    assert all(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(state, base_state))
    where = SPLITS[(kind, placement, budget)]
    assert [opt.state_placement(p) for p in model.parameters()] == where
    for p, w in zip(model.parameters(), where):
        for t in (v for k, v in opt.state[p].items() if k != "step"):
            assert in_stowage_memory(t) == (w != "device")  # offloaded state is in the "host" memory
    sizes = STATE[kind]
    resident = sum(s for s, w in zip(sizes, where) if w == "device")
    streamed = [s for s, w in zip(sizes, where) if w == "streamed"]
    assert opt.state_device_bytes() == resident + max(streamed, default=0)  # + the one scratch
    assert opt.state_host_bytes() == sum(sizes) - resident
    if budget is not None:
        assert opt.state_device_bytes() <= budget


@emulated
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_pytorchs_live_bytes_drop_by_exactly_the_state_offloaded(kind):
    # The first step makes the state: PyTorch's CPU allocator keeps it (and the 4-byte step
    # counters) with state on the device, only the counters when it is mapped, the counters and
    # one scratch (the largest parameter's state) when it is streamed.
    (x, y), = batches(1)
    sizes, kept = STATE[kind], {}
    for where in ("none", "mapped", "streamed"):
        model = make_model()
        opt = KINDS[kind](model.parameters(), state_offload=where, **HYPER[kind])
        torch.nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
        held = stowage.memory_allocated(0)
        kept[where] = pytorch_cpu_bytes(opt.step)
        # stowage's memory holds the offloaded tensors (m and v: half the state each), each in
        # whole 512-byte blocks, and has them back with the optimizer.
        n = 2 if kind == "adamw" else 1
        blocks = 0 if where == "none" else sum(n * (-(-(s // n) // 512) * 512) for s in sizes)
        assert stowage.memory_allocated(0) - held == blocks
        del opt, model
        assert stowage.memory_allocated(0) == held
    assert kept["none"] == sum(sizes) + 4 * len(sizes)
    assert kept["none"] - kept["mapped"] == sum(sizes)
    assert kept["none"] - kept["streamed"] == sum(sizes) - max(sizes)


@emulated
def test_the_memory_goes_back_to_stowage_with_the_optimizer():
    held = stowage.memory_allocated(0)
    model = make_model()
    opt = SharedStorageAdamW(model.parameters(), state_offload="mapped")
    train(model, opt, batches(1))
    assert stowage.memory_allocated(0) > held
    del opt
    assert stowage.memory_allocated(0) == held


@emulated
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_state_dict_round_trips_across_placements(kind):
    data = batches(8)
    model = make_model()
    opt = KINDS[kind](model.parameters(), state_offload="mapped", **HYPER[kind])
    train(model, opt, data[:4])
    raw = opt.state_dict()
    assert in_stowage_memory(raw["state"][0]["exp_avg" if kind == "adamw" else "momentum_buffer"])
    buffer = io.BytesIO()
    torch.save(raw, buffer)  # ordinary CPU tensors, wherever their bytes are
    sd = torch.load(io.BytesIO(buffer.getvalue()))
    saved = {i: {k: bits(v) for k, v in e.items() if k != "step"} for i, e in sd["state"].items()}
    assert saved.keys() == {0, 1, 2, 3} and all(torch.equal(bits(v), saved[i][k]) for i, e in raw["state"].items()
                                                for k, v in e.items() if k != "step")
    expected = train(model, opt, data[4:])
    for placement, budget in (("none", None), ("streamed", None), ("mapped", 3000 if kind == "adamw" else 1500),
                              ("mapped", None)):
        model2 = make_model(seed=5)
        opt2 = KINDS[kind](model2.parameters(), state_offload=placement, state_device_budget=budget, **HYPER[kind])
        opt2.load_state_dict(copy.deepcopy(sd))
        for i, p in enumerate(model2.parameters()):
            for k, b in saved[i].items():
                t = opt2.state[p][k]
                assert torch.equal(bits(t), b)
                assert in_stowage_memory(t) == (opt2.state_placement(p) != "device")  # back in its placement
        assert train(model2, opt2, data[4:]) == expected, (placement, budget)
    # Plain torch.optim loads it as it is.
    plain = torch.optim.AdamW(make_model().parameters()) if kind == "adamw" else torch.optim.SGD(
        make_model().parameters(), lr=0.1, momentum=0.9)
    plain.load_state_dict(copy.deepcopy(sd))
    first = next(iter(plain.state.values()))
    assert torch.equal(bits(first["exp_avg" if kind == "adamw" else "momentum_buffer"]),
                       saved[0]["exp_avg" if kind == "adamw" else "momentum_buffer"])


def step_with(opt, params, seed):
    """One step with a fixed gradient for each of params (the model need not run)."""
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(torch.bfloat16)
    opt.step()


@emulated
def test_a_group_added_later_continues_the_budget_and_the_scratch_grows():
    # 2240 + 56 bytes of the first group fit in 2400. The second group's 7680 + 320 do not: streamed,
    # its scratch (7680) would need more than the 104 bytes left, so it is refused and nothing moves.
    model = make_model()
    opt = SharedStorageAdamW(model[2].parameters(), state_offload="streamed", state_device_budget=2400)
    with pytest.raises(InvalidArgumentError, match="scratch of 7680 bytes on cpu .*, 7680 more .* 104 bytes"):
        opt.add_param_group({"params": model[0].parameters()})
    assert len(opt.param_groups) == 1 and model[0].weight.dtype == torch.float32
    # Mapped: the second group's state goes to host memory, the first group's stays.
    model = make_model()
    opt = SharedStorageAdamW(model[2].parameters(), state_offload="mapped", state_device_budget=2400)
    opt.add_param_group({"params": model[0].parameters()})
    assert [opt.state_placement(p) for p in (model[2].weight, model[2].bias, model[0].weight, model[0].bias)] == [
        "device", "device", "mapped", "mapped"]
    train(model, opt, batches(2))
    assert opt.state_device_bytes() == 2296 and opt.state_host_bytes() == 8000
    # Streamed without a budget: the scratch grows to the new group's largest state; the numbers
    # are those of state on the device.
    runs = []
    for where in ("none", "streamed"):
        model = make_model()
        opt = SharedStorageAdamW(model[2].parameters(), lr=1e-2, state_offload=where)
        step_with(opt, model[2].parameters(), 0)
        scratch_before = opt.state_device_bytes()
        opt.add_param_group({"params": model[0].parameters()})
        for k in range(1, 4):
            step_with(opt, model.parameters(), k)
        runs.append([bits(opt.master(p)) for p in model.parameters()])
    assert scratch_before == 2240 and opt.state_device_bytes() == 7680
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@emulated
def test_bad_arguments_are_refused_and_change_nothing():
    model = make_model()
    for kind, largest in (("adamw", 7680), ("sgd", 3840)):
        for kwargs, needle in [
                (dict(state_offload="disk"), "'disk' is not one of none, mapped, streamed"),
                (dict(state_offload=None), "None is not one of none, mapped, streamed"),
                (dict(state_offload="mapped", state_device_budget=-1), "bytes >= 0 or None \\(got -1\\)"),
                (dict(state_offload="mapped", state_device_budget=1.5), "bytes >= 0"),
                (dict(state_offload="mapped", state_device_budget=True), "bytes >= 0"),
                (dict(state_device_budget=100), "give state_offload='mapped' or 'streamed'"),
                (dict(state_offload="streamed", state_device_budget=largest - 1),
                 f"scratch of {largest} bytes on cpu")]:
            with pytest.raises(InvalidArgumentError, match=needle):
                KINDS[kind](model.parameters(), **kwargs)
            assert all(p.dtype == torch.float32 for p in model.parameters())  # nothing moved
    with pytest.raises(InvalidArgumentError, match="not one of none"):
        apply(model, torch.optim.AdamW(model.parameters()), state_offload="host")
    with pytest.raises(InvalidArgumentError, match="shared-storage optimizers"):
        apply(model, torch.optim.AdamW(model.parameters()), shared_storage=False, state_offload="mapped")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    opt = SharedStorageAdamW(model.parameters(), state_offload="mapped")
    with pytest.raises(InvalidArgumentError, match="not one of this optimizer's"):
        opt.state_placement(torch.zeros(3))
    # A refused state_dict leaves the offloaded state as it was.
    train(model, opt, batches(2))
    good = copy.deepcopy(opt.state_dict())
    before, kept = states(opt, model), [opt.state[p]["exp_avg"] for p in model.parameters()]
    bad = copy.deepcopy(good)
    bad["state"][3]["exp_avg"] = torch.zeros(2)
    with pytest.raises(InvalidArgumentError, match="exp_avg is not a tensor of shape"):
        opt.load_state_dict(bad)
    assert all(all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(states(opt, model), before))
    assert all(opt.state[p]["exp_avg"] is t and in_stowage_memory(t) for p, t in zip(model.parameters(), kept))
    assert opt.state_host_bytes() == 10296


@emulated
def test_apply_turns_offload_on_with_its_budget():
    data = batches(4)
    runs = []
    for kwargs in ({}, dict(state_offload="mapped", state_device_budget=3000)):
        model = make_model()
        adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x, y = data[0]  # one plain fp32 step: a resumed optimizer's moments go to their placements
        torch.nn.functional.cross_entropy(model(x), y).backward()
        adamw.step()
        opt = apply(model, adamw, **kwargs).optimizer
        runs.append((train(model, opt, data[1:]), [bits(opt.master(p)) for p in model.parameters()], model, opt))
    (base_losses, base_masters, _, _), (losses, masters, model, opt) = runs
    assert losses == base_losses and all(torch.equal(a, b) for a, b in zip(masters, base_masters))
    assert [opt.state_placement(p) for p in model.parameters()] == SPLITS[("adamw", "mapped", 3000)]
    assert in_stowage_memory(opt.state[model[0].weight]["exp_avg"])
    assert opt.state_host_bytes() == 7680 and opt.state_device_bytes() == 2616


@emulated
def test_under_a_cuda_library_cpu_parameters_offload_to_plain_cpu_memory(monkeypatch):
    # There stowage's memory is a GPU's, which the host kernels cannot read: the same numbers and
    # bookkeeping, the state in ordinary CPU memory.
    from stowage.torch import offload
    monkeypatch.setattr(offload.memory, "using_cuda", lambda: True)
    (base_losses, base_masters, base_state, _, _), (losses, masters, state, model, opt) = same_run(
        "adamw", "mapped", None)
    assert losses == base_losses and all(torch.equal(a, b) for a, b in zip(masters, base_masters))
    assert all(all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(state, base_state))
    assert not any(in_stowage_memory(t) for p in model.parameters() for t in opt.state[p].values())
    assert opt.state_host_bytes() == 10296 and opt.state_device_bytes() == 0


# --- on a GPU: CUDA parameters, pinned host memory, torch.cuda.memory_allocated() ---

def gpu_model(seed=0):
    # Every tensor a multiple of 128 elements: each state tensor is whole 512-byte blocks, so the
    # allocator's bytes are the tensors' bytes.
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 128)).cuda()


@cuda
@pytest.mark.parametrize("kind,placement,budget", [("adamw", "mapped", None), ("adamw", "streamed", None),
                                                   ("adamw", "mapped", 3000), ("adamw", "streamed", 8000),
                                                   ("sgd", "mapped", None), ("sgd", "streamed", 4000)])
def test_on_cuda_offloaded_state_gives_the_same_numbers(kind, placement, budget):
    (base_losses, base_masters, base_state, _, _), (losses, masters, state, model, opt) = same_run(
        kind, placement, budget, device="cuda")
    assert losses == base_losses
    assert all(torch.equal(a, b) for a, b in zip(masters, base_masters))
    assert all(all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(state, base_state))
    assert [opt.state_placement(p) for p in model.parameters()] == SPLITS[(kind, placement, budget)]
    for p in model.parameters():
        for t in (v for k, v in opt.state[p].items() if k != "step"):
            offloaded = opt.state_placement(p) != "device"
            assert t.is_cuda != offloaded and (t.is_pinned() if offloaded else True)


@cuda
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_on_cuda_memory_allocated_drops_by_exactly_the_state_offloaded(kind):
    x = torch.randn(64, 256, device="cuda")
    y = torch.randint(0, 128, (64,), device="cuda")
    allocated, host, device = {}, {}, {}
    for where in ("none", "mapped", "streamed"):
        model = gpu_model()
        opt = KINDS[kind](model.parameters(), state_offload=where, **HYPER[kind])
        for _ in range(2):
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
            opt.step()
        torch.cuda.synchronize()
        allocated[where], host[where] = torch.cuda.memory_allocated(), opt.state_host_bytes()
        device[where] = opt.state_device_bytes()
        del opt, model
        torch.cuda.empty_cache()
    per = 8 if kind == "adamw" else 4
    sizes = [per * n for n in (256 * 512, 512, 512 * 128, 128)]
    assert host["mapped"] == host["streamed"] == sum(sizes) and host["none"] == 0
    assert allocated["none"] - allocated["mapped"] == sum(sizes)
    assert allocated["none"] - allocated["streamed"] == sum(sizes) - max(sizes)  # all but one scratch
    assert device == {"none": sum(sizes), "mapped": 0, "streamed": max(sizes)}
