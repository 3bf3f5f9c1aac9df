"""stowage.torch.optim: shared-storage weights with fused AdamW / SGD, held bit for bit to plain
PyTorch with fp32 masters and a bf16 copy (stowage.torch.reference), on CPU tensors."""
import copy
import io
import math

import pytest

torch = pytest.importorskip("torch")

from stowage import InvalidArgumentError, UnsupportedError  # noqa: E402
from stowage.torch.optim import SharedStorageAdamW, SharedStorageSGD  # noqa: E402
from stowage.torch.reference import MasterWeightsOptimizer  # noqa: E402
from optim_training import batches, bits, make_model, train  # noqa: E402


def twins(kind):
    """Two copies of the model: one under the shared-storage optimizer, one under the reference,
    with the same hyper-parameters (clipping and weight decay on). (ours, opt, base, ref)."""
    ours, base = make_model(), make_model()
    hyper = dict(lr=3e-3, weight_decay=0.05, max_grad_norm=0.5) if kind == "adamw" else dict(
        lr=0.05, momentum=0.9, weight_decay=0.01, max_grad_norm=0.5)
    opt = (SharedStorageAdamW if kind == "adamw" else SharedStorageSGD)(ours.parameters(), **hyper)
    return ours, opt, base, MasterWeightsOptimizer(base.parameters(), kind=kind, **hyper)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_losses_masters_and_bf16_weights_are_bit_identical_to_plain_pytorch(kind):
    data = batches(12)
    ours, opt, base, ref = twins(kind)
    assert all(p.dtype == torch.bfloat16 for p in ours.parameters())
    poison = {5}  # a NaN gradient: the step is skipped by both
    assert train(ours, opt, data, poison) == train(base, ref, data, poison)
    assert opt.last_step_skipped is False and ref.steps == 11
    for p, q, master in zip(ours.parameters(), base.parameters(), ref.masters):
        assert torch.equal(bits(opt.master(p)), bits(master))  # every fp32 bit
        assert torch.equal(bits(p), bits(q))


def test_the_kept_multi_tensor_call_follows_missing_gradients_and_replaced_state():
    """step() keeps its multi-tensor call from step to step; with a parameter that has no gradient
    for two steps, a moment the user replaced, one whose memory moved and a count set in place, it
    gives the numbers of a call built afresh at every step, and each parameter counts its own steps."""
    data = batches(8)
    a, b = make_model(), make_model()
    oa, ob = SharedStorageAdamW(a.parameters(), lr=3e-3), SharedStorageAdamW(b.parameters(), lr=3e-3)
    for k, (x, y) in enumerate(data):
        for model, opt in ((a, oa), (b, ob)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
            params = list(model.parameters())
            if k in (2, 3):
                params[0].grad = None
            if k == 5:  # a copy in its place: the steps from now on must update the copy
                opt.state[params[1]]["exp_avg"] = opt.state[params[1]]["exp_avg"].clone()
            if k == 6:  # the same tensor over new memory, and a count set in place
                opt.state[params[2]]["exp_avg_sq"].data = opt.state[params[2]]["exp_avg_sq"].clone()
                opt.state[params[0]]["step"].fill_(1.0)
        ob._batch_cache.clear()
        oa.step()
        ob.step()
    assert [float(oa.state[p]["step"]) for p in a.parameters()] == [3.0] + [8.0] * (len(list(a.parameters())) - 1)
    for saved in oa.state_dict()["state"].values():  # a saved count is its own tensor, not a view of ours
        saved["step"].add_(100.0)
    assert [float(oa.state[p]["step"]) for p in a.parameters()] == [3.0] + [8.0] * (len(list(a.parameters())) - 1)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(bits(oa.master(p)), bits(ob.master(q)))
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(bits(oa.state[p][key]), bits(ob.state[q][key]))


def test_half_up_rounding_keeps_the_master_and_differs_only_on_ties():
    data = batches(4)
    ours, base = make_model(), make_model()
    opt = SharedStorageAdamW(ours.parameters(), lr=1e-2, rounding="half_up")
    ref = MasterWeightsOptimizer(base.parameters(), lr=1e-2)
    for x, y in data:  # the same gradients for both: the master must not depend on the rounding
        for model, o in ((ours, opt), (base, ref)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
        for p, q in zip(ours.parameters(), base.parameters()):
            p.grad = q.grad.clone()
        opt.step()
        ref.step()
    for p, master in zip(ours.parameters(), ref.masters):
        m = bits(master)
        assert torch.equal(bits(opt.master(p)), m)
        half_up = ((m + 0x8000) >> 16).to(torch.int16)  # round half away from zero
        assert torch.equal(bits(p), half_up)


def test_the_weights_cost_four_bytes_per_parameter_not_six():
    model = make_model()
    n = sum(p.numel() for p in model.parameters())
    ref_bytes = MasterWeightsOptimizer(make_model().parameters()).storage_bytes()
    assert ref_bytes == 6 * n
    opt = SharedStorageAdamW(model.parameters(), rounding="half_up")
    # 4 bytes per element, each parameter padded to 64 elements (128-byte lines of the bf16 plane)
    padded = sum(-(-p.numel() // 64) * 64 for p in model.parameters())
    assert opt.storage_bytes() == 4 * padded
    assert ref_bytes - opt.storage_bytes() == 2 * n - 4 * (padded - n)
    # The parameters are views of the planes: no other copy of the weights exists.
    plane = opt._buckets[0].bf16
    for p in model.parameters():
        assert p.untyped_storage().data_ptr() == plane.untyped_storage().data_ptr() if hasattr(
            p, "untyped_storage") else p.storage().data_ptr() == plane.storage().data_ptr()


def test_param_groups_have_their_own_lr_and_weight_decay():
    data = batches(5)
    ours, base = make_model(), make_model()
    groups = lambda m: [{"params": m[0].parameters(), "lr": 1e-2, "weight_decay": 0.1},  # noqa: E731
                        {"params": m[2].parameters()}]
    opt = SharedStorageAdamW(groups(ours), lr=1e-3, weight_decay=0.0)
    assert [g["lr"] for g in opt.param_groups] == [1e-2, 1e-3]
    train(ours, opt, data)
    # The reference, one optimizer per group.
    r0 = MasterWeightsOptimizer(base[0].parameters(), lr=1e-2, weight_decay=0.1)
    r1 = MasterWeightsOptimizer(base[2].parameters(), lr=1e-3, weight_decay=0.0)
    for x, y in data:
        r0.zero_grad(), r1.zero_grad()
        torch.nn.functional.cross_entropy(base(x.to(torch.bfloat16)).float(), y).backward()
        r0.step(), r1.step()
    for p, master in zip(ours.parameters(), r0.masters + r1.masters):
        assert torch.equal(bits(opt.master(p)), bits(master))


def test_checkpoint_round_trips_exactly_and_loads_into_plain_adamw():
    data = batches(8)
    model = make_model()
    opt = SharedStorageAdamW(model.parameters(), lr=2e-3)
    train(model, opt, data[:4])
    sd = copy.deepcopy(opt.state_dict())
    masters = opt.master_state_dict(model)
    assert all(v.dtype == torch.float32 for v in masters.values())

    # Into a fresh shared-storage optimizer: the same numbers from there on.
    model2 = make_model(seed=7)
    opt2 = SharedStorageAdamW(model2.parameters(), lr=2e-3)
    opt2.load_state_dict(sd)
    assert torch.equal(bits(opt2.master(next(model2.parameters()))), bits(masters["0.weight"]))
    assert train(model, opt, data[4:]) == train(model2, opt2, data[4:])

    # Into plain torch.optim.AdamW on an fp32 model: it starts from the same master, m, v and step.
    fp32 = make_model(seed=9)
    fp32.load_state_dict(masters)
    adamw = torch.optim.AdamW(fp32.parameters(), lr=2e-3)
    adamw.load_state_dict(sd)
    for p, q in zip(fp32.parameters(), make_model().parameters()):
        st = adamw.state[p]
        assert st["exp_avg"].dtype == torch.float32 and float(st["step"]) == 4.0
    assert torch.equal(bits(fp32[0].weight), bits(masters["0.weight"]))
    # And back: a plain fp32 checkpoint becomes the master bit for bit.
    model3 = make_model(seed=3)
    opt3 = SharedStorageAdamW(model3.parameters(), lr=2e-3)
    opt3.load_state_dict(adamw.state_dict())
    opt3.load_master_state_dict(model3, fp32.state_dict())
    assert torch.equal(bits(opt3.master(model3[2].bias)), bits(fp32[2].bias))
    assert torch.equal(bits(opt3.state[model3[0].weight]["exp_avg"]), bits(sd["state"][0]["exp_avg"]))
    assert float(opt3.state[model3[0].weight]["step"]) == 4.0


def test_clear_errors_and_nothing_changed():
    model = make_model()
    with pytest.raises(ValueError, match="rounding 'even'"):
        SharedStorageAdamW(model.parameters(), rounding="even")
    with pytest.raises(InvalidArgumentError, match="fp32 model"):
        SharedStorageAdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))])
    with pytest.raises(InvalidArgumentError, match="max_grad_norm"):
        SharedStorageAdamW(model.parameters(), max_grad_norm=-1)
    with pytest.raises(InvalidArgumentError, match="loss_scale"):
        SharedStorageSGD(model.parameters(), loss_scale=math.inf)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # refused before anything moved
    with pytest.raises(UnsupportedError, match="CPU and CUDA tensors"):
        SharedStorageAdamW([torch.nn.Parameter(torch.zeros(3, device="meta"))])
    opt = SharedStorageAdamW(model.parameters())
    with pytest.raises(InvalidArgumentError, match="not one of this optimizer's"):
        opt.master(torch.zeros(3))
    with pytest.raises(InvalidArgumentError, match="param groups"):
        opt.load_state_dict({"state": {}, "param_groups": []})


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda o: torch.save(o, io.BytesIO())], ids=["deepcopy", "save"])
def test_copying_or_pickling_the_optimizer_is_refused_and_it_trains_on(copier):
    """torch.optim.Optimizer's __getstate__ keeps only param_groups and state: a copy lost the planes
    that hold the masters and failed at its first step (AttributeError)."""
    model = make_model()
    opt = SharedStorageAdamW(model.parameters(), lr=1e-2)
    train(model, opt, batches(1))
    before = [bits(opt.master(p)) for p in model.parameters()]
    with pytest.raises(UnsupportedError, match="cannot be copied or pickled.*state_dict\\(\\)"):
        copier(opt)
    assert all(torch.equal(b, bits(opt.master(p))) for b, p in zip(before, model.parameters()))
    copy.deepcopy(opt.state_dict())  # what checkpoint code copies
    assert train(model, opt, batches(2))


def test_a_group_added_later_is_updated_and_a_bad_one_changes_nothing():
    data = batches(3)
    ours, base = make_model(), make_model()
    opt = SharedStorageAdamW(ours[0].parameters(), lr=1e-2)
    opt.add_param_group({"params": ours[2].parameters(), "lr": 1e-3})
    assert ours[2].weight.dtype == torch.bfloat16 and len(opt.param_groups) == 2
    r0 = MasterWeightsOptimizer(base[0].parameters(), lr=1e-2)
    r1 = MasterWeightsOptimizer(base[2].parameters(), lr=1e-3)
    train(ours, opt, data)
    for x, y in data:
        r0.zero_grad(), r1.zero_grad()
        torch.nn.functional.cross_entropy(base(x.to(torch.bfloat16)).float(), y).backward()
        r0.step(), r1.step()
    for p, master in zip(ours.parameters(), r0.masters + r1.masters):
        assert torch.equal(bits(opt.master(p)), bits(master))
    # A second group with a bad parameter: refused before the good one moved.
    good = torch.nn.Parameter(torch.ones(8))
    with pytest.raises(InvalidArgumentError, match="fp32 model"):
        SharedStorageAdamW([{"params": [good]}, {"params": [torch.nn.Parameter(torch.ones(8).double())]}])
    assert good.dtype == torch.float32
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [ours[0].weight]})
    assert len(opt.param_groups) == 2


def test_a_state_that_does_not_fit_is_refused_and_changes_nothing():
    model = make_model()
    opt = SharedStorageAdamW(model.parameters(), lr=1e-2)
    train(model, opt, batches(2))
    good = copy.deepcopy(opt.state_dict())
    before = [bits(opt.master(p)).clone() for p in model.parameters()]

    def refused(mutate, needle, error=InvalidArgumentError):
        sd = copy.deepcopy(good)
        mutate(sd)
        with pytest.raises(error, match=needle):
            opt.load_state_dict(sd)
        assert opt.param_groups[0]["lr"] == 1e-2 and float(opt.state[model[0].weight]["step"]) == 2.0
        assert all(torch.equal(bits(opt.master(p)), b) for p, b in zip(model.parameters(), before))

    refused(lambda sd: sd["state"][0].update(exp_avg=torch.zeros(2)), "exp_avg is not a tensor of shape")  # was a crash
    refused(lambda sd: (sd["param_groups"][0].update(lr=0.5), sd["stowage_master"].__setitem__(1, torch.zeros(3))),
            "stowage_master tensor is not of shape")
    refused(lambda sd: sd["state"][0].update(step="3"), "is not a count")
    refused(lambda sd: sd["state"][0].update(momentum_buffer=torch.zeros(40, 24)), "'momentum_buffer' is not state")
    refused(lambda sd: sd["param_groups"][0].update(amsgrad=True), "amsgrad", UnsupportedError)
    with pytest.raises(InvalidArgumentError, match="not a set"):
        SharedStorageAdamW({torch.nn.Parameter(torch.ones(2))})
    a = torch.nn.Parameter(torch.ones(8))
    with pytest.raises(InvalidArgumentError, match="more than one parameter group"):
        SharedStorageAdamW([{"params": [a]}, {"params": [torch.nn.Parameter(torch.ones(8)), a]}])
    assert a.dtype == torch.float32


def test_a_non_contiguous_saved_moment_loads_by_its_values():
    model = make_model()
    opt = SharedStorageAdamW(model.parameters(), lr=1e-2)
    train(model, opt, batches(2))
    sd = copy.deepcopy(opt.state_dict())
    m = sd["state"][0]["exp_avg"]
    sd["state"][0]["exp_avg"] = m.t().contiguous().t()  # same values, transposed strides
    model2 = make_model()
    opt2 = SharedStorageAdamW(model2.parameters(), lr=1e-2)
    opt2.load_state_dict(sd)
    assert train(model, opt, batches(2, seed=5)) == train(model2, opt2, batches(2, seed=5))


def test_resuming_torch_sgd_keeps_its_momentum():
    data = batches(4)
    ours, base = make_model(), make_model()
    sgd = torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
    for x, y in data[:2]:  # two plain fp32 steps: the buffers are under way
        sgd.zero_grad()
        torch.nn.functional.cross_entropy(ours(x).float(), y).backward()
        sgd.step()
    buf = sgd.state[ours[0].weight]["momentum_buffer"].clone()
    opt = SharedStorageSGD(ours.parameters(), lr=0.05, momentum=0.9)
    opt.load_state_dict(sgd.state_dict())
    g = torch.ones_like(ours[0].weight)
    for p in ours.parameters():
        p.grad = torch.zeros_like(p)
    ours[0].weight.grad = g.to(torch.bfloat16)
    opt.step()
    assert torch.equal(opt.state[ours[0].weight]["momentum_buffer"], buf * 0.9 + g)  # not restarted at g
    del base


# Steps in which some parameters get no gradient (stochastic depth, unrouted experts, unused branches).
MISSING = {0: (1,), 1: (2, 3), 2: (1,), 4: (0, 1), 6: (3,)}


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_a_parameter_without_a_gradient_is_skipped_and_keeps_its_own_count_as_the_reference(kind):
    """Each parameter counts its own steps, as torch.optim: AdamW's bias correction and the start of
    SGD's momentum buffer follow it. The reference once counted step() calls for all parameters."""
    data = batches(9)
    ours, opt, base, ref = twins(kind)
    poison = {7}  # a skipped step moves no count either
    assert train(ours, opt, data, poison, MISSING) == train(base, ref, data, poison, MISSING)
    counts = [8 - sum(i in gone for gone in MISSING.values()) for i in range(4)]
    assert counts == [7, 5, 7, 6] and ref.counts == counts and ref.steps == 8
    assert [int(opt.state[p]["step"]) for p in ours.parameters()] == counts
    for p, q, master in zip(ours.parameters(), base.parameters(), ref.masters):
        assert torch.equal(bits(opt.master(p)), bits(master))
        assert torch.equal(bits(p), bits(q))


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_with_missing_gradients_stowage_and_the_reference_follow_torch_optim(kind):
    """The same gradients into stowage, the reference and torch.optim on fp32 parameters: stowage
    and the reference bit-identical, torch.optim within its last-bit differences (the reference's
    one count for all parameters was 2e-3 away after a parameter had missed one step)."""
    def make():
        torch.manual_seed(0)
        return [torch.nn.Parameter(torch.randn(200)) for _ in range(4)]

    hyper = dict(lr=1e-2, weight_decay=0.1) if kind == "adamw" else dict(lr=0.05, momentum=0.9, weight_decay=0.01)
    ours, base, plain = make(), make(), make()
    opt = (SharedStorageAdamW if kind == "adamw" else SharedStorageSGD)(ours, **hyper)
    ref = MasterWeightsOptimizer(base, kind=kind, **hyper)
    torch_opt = (torch.optim.AdamW if kind == "adamw" else torch.optim.SGD)(plain, **hyper)
    g = torch.Generator().manual_seed(3)
    for k in range(8):
        grads = [torch.randn(200, generator=g).to(torch.bfloat16) for _ in range(4)]
        for params in (ours, base, plain):
            for i, (p, grad) in enumerate(zip(params, grads)):
                p.grad = None if i in MISSING.get(k, ()) else grad.to(p.dtype if params is plain else torch.bfloat16)
        opt.step(), ref.step(), torch_opt.step()
    for i, (p, master, q) in enumerate(zip(ours, ref.masters, plain)):
        assert torch.equal(bits(opt.master(p)), bits(master))
        torch.testing.assert_close(opt.master(p), q.detach(), rtol=1e-6, atol=1e-6)
        if kind == "adamw":
            assert float(opt.state[p]["step"]) == float(torch_opt.state[q]["step"]) == ref.counts[i]


def test_zeroed_gradients_of_a_skipped_branch_are_stepped_as_torch_optim_steps_them():
    """torch.optim's zero_grad() before PyTorch 2.0 zeroes the gradients: a branch left out of a
    backward has a zero gradient and is stepped (decay, moments). The reference does the same with
    zero_grad(set_to_none=False)."""
    def make():
        torch.manual_seed(0)
        return [torch.nn.Parameter(torch.randn(64)) for _ in range(2)]

    ours, base = make(), make()
    opt, ref = SharedStorageAdamW(ours, lr=1e-2, weight_decay=0.1), MasterWeightsOptimizer(base, lr=1e-2,
                                                                                          weight_decay=0.1)
    x = torch.randn(64).to(torch.bfloat16)
    for k in range(5):
        for params, o in ((ours, opt), (base, ref)):
            o.zero_grad(set_to_none=False)
            used = params if k % 2 == 0 else params[:1]  # the second is skipped in odd steps, after the first
            sum((p * x).float().square().sum() for p in used).backward()
            o.step()
    assert [int(opt.state[p]["step"]) for p in ours] == ref.counts == [5, 5]
    assert all(torch.equal(bits(opt.master(p)), bits(m)) for p, m in zip(ours, ref.masters))


def sparse_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Embedding(50, 8))


def sparse_loss(model, sparse):
    model[1].sparse = sparse
    idx = torch.tensor([[1, 4, 4, 9], [2, 3, 7, 1]])
    return model[0](model[1](idx)).float().square().mean()


@pytest.mark.parametrize("named", [True, False], ids=["attached", "not_attached"])
def test_a_sparse_gradient_is_refused_at_step_naming_the_parameter_and_nothing_changes(named):
    model, twin = sparse_model(), sparse_model()
    opt = SharedStorageAdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    twin_opt = SharedStorageAdamW(twin.parameters(), lr=1e-2, weight_decay=0.1)
    if named:
        opt.attach(model)
    for m, o in ((model, opt), (twin, twin_opt)):  # a dense step first: state and counts exist
        o.zero_grad()
        sparse_loss(m, False).backward()
        o.step()
    params = list(model.parameters())
    before = [(bits(opt.master(p)).clone(), {k: v.clone() for k, v in opt.state[p].items()}) for p in params]
    opt.zero_grad(set_to_none=True)  # (a zeroed dense gradient would take the sparse one in as dense)
    sparse_loss(model, True).backward()
    assert model[1].weight.grad.is_sparse and model[0].weight.grad is not None  # a dense one comes first
    which = "parameter '1.weight'" if named else "parameter 2 of param group 0"
    needle = rf"step\(\): {which} \(50, 8\) has a torch.sparse_coo gradient; sparse gradients are not supported"
    with pytest.raises(UnsupportedError, match=needle + ".*sparse=False.*Nothing was written"):
        opt.step()
    for p, (master, state) in zip(params, before):
        assert torch.equal(bits(opt.master(p)), master)
        assert state.keys() == opt.state[p].keys()
        assert all(torch.equal(bits(v), bits(opt.state[p][k])) for k, v in state.items())
    # Dense again, it trains on as if the refused step had not been tried.
    for m, o in ((model, opt), (twin, twin_opt)):
        o.zero_grad(set_to_none=True)
        sparse_loss(m, False).backward()
        o.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(bits(opt.master(p)), bits(twin_opt.master(q)))
        assert float(opt.state[p]["step"]) == float(twin_opt.state[q]["step"]) == 2.0


@pytest.mark.parametrize("module", ["embedding", "embedding_bag"])
@pytest.mark.parametrize("torch_optimizer", [torch.optim.AdamW, torch.optim.SGD])
def test_apply_refuses_a_sparse_embedding_up_front_and_changes_nothing(module, torch_optimizer):
    from stowage.torch.adaptor import apply
    emb = torch.nn.Embedding(50, 8, sparse=True) if module == "embedding" else torch.nn.EmbeddingBag(
        50, 8, sparse=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), emb)
    params = list(model.parameters())
    values = [bits(p).clone() for p in params]
    base = torch_optimizer(model.parameters(), lr=1e-2)
    kind = "Embedding" if module == "embedding" else "EmbeddingBag"
    with pytest.raises(UnsupportedError, match=rf"apply\(\): parameter '1.weight' \(50, 8\) gets sparse gradients "
                                               rf"from {kind}\(sparse=True\); sparse gradients are not supported"
                                               ".*sparse=False.*Nothing was changed"):
        apply(model, base, recompute=True)
    assert all(a is b and a.dtype == torch.float32 and torch.equal(bits(a), v)
               for a, b, v in zip(model.parameters(), params, values))
    assert not base.state and all(a is b for a, b in zip(base.param_groups[0]["params"], params))
    assert not any(m._forward_hooks or m._forward_pre_hooks or "forward" in vars(m) for m in model.modules())
    # Frozen, it makes no gradient: accepted (held at lr=0, as a frozen part must be).
    emb.weight.requires_grad_(False)
    opt = apply(model, torch_optimizer([{"params": [emb.weight], "lr": 0.0},
                                        {"params": list(model[0].parameters())}], lr=1e-2)).optimizer
    assert emb.weight.dtype == torch.bfloat16 and isinstance(opt, (SharedStorageAdamW, SharedStorageSGD))


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_on_cuda_the_kernels_run_on_the_device_with_the_same_numbers(kind):
    import stowage
    if not stowage.using_cuda():
        pytest.skip("libstowage is not using CUDA here")
    data = [(x.cuda(), y.cuda()) for x, y in batches(8)]
    ours, base = make_model().cuda(), make_model().cuda()
    hyper = dict(lr=3e-3, weight_decay=0.05, max_grad_norm=0.5) if kind == "adamw" else dict(
        lr=0.05, momentum=0.9, weight_decay=0.01, max_grad_norm=0.5)
    opt = (SharedStorageAdamW if kind == "adamw" else SharedStorageSGD)(ours.parameters(), **hyper)
    ref = MasterWeightsOptimizer(base.parameters(), kind=kind, **hyper)
    assert all(p.is_cuda and p.dtype == torch.bfloat16 for p in ours.parameters())
    assert train(ours, opt, data, poison={3}) == train(base, ref, data, poison={3})
    for p, q, master in zip(ours.parameters(), base.parameters(), ref.masters):
        assert torch.equal(bits(opt.master(p)), bits(master))
        assert torch.equal(bits(p), bits(q))
