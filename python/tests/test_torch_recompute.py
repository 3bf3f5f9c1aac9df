"""stowage.torch.recompute: storage-release activation recomputation (docs/recompute.md, "From
PyTorch"). CPU only; every comparison is bit for bit (torch.equal)."""
import contextlib
import copy
import dataclasses

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from stowage.errors import InvalidArgumentError, StowageError  # noqa: E402
from stowage.torch import gpt  # noqa: E402
from stowage.torch import recompute as rc  # noqa: E402
from stowage.torch.recompute import ReleasedActivation, recompute_activations  # noqa: E402
from stowage.errors import UnsupportedError  # noqa: E402
from memory_trace import forward_backward_bytes  # noqa: E402
from pickling import loaded_without_stowage  # noqa: E402

B, S, HIDDEN, INTER, LAYERS = 2, 8, 16, 48, 3
TOKENS = B * S


class SwiGLU(nn.Module):
    def forward(self, x):
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class GeneralGelu(nn.Module):
    """F.gelu in a module class of its own, which stowage does not know (_known_activations): it
    takes the general path, a rerun with a graph and a copy into the released storage."""

    def forward(self, x):
        return F.gelu(x)


class GeluDropout(nn.Module):
    def forward(self, x):
        return F.dropout(F.gelu(x), p=0.3, training=self.training)


class MLP(nn.Module):
    def __init__(self, act, gated=False):
        super().__init__()
        self.fc1 = nn.Linear(HIDDEN, INTER * (2 if gated else 1))
        self.act = act
        self.fc2 = nn.Linear(INTER, HIDDEN)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        return x + self.mlp(x)


class InplaceResidual(Block):
    # The MLP's output (a view on torch 1.13: linear of a 3-d input) is modified in place after
    # the parent returned, which replaces its backward node.
    def forward(self, x):
        y = self.mlp(x)
        y += x
        return y


class SharedTwice(Block):
    # The same MLP (one parent module) runs twice in one forward.
    def forward(self, x):
        return self.mlp(self.mlp(x))


def make(kind, dtype=torch.float32, seed=0, block=Block):
    torch.manual_seed(seed)
    act = {"gelu": nn.GELU, "silu": nn.SiLU, "gelu_general": GeneralGelu, "swiglu": SwiGLU,
           "swiglu_known": gpt.SwiGLU, "dropout": GeluDropout}[kind]
    return nn.Sequential(*[block(MLP(act(), gated=kind.startswith("swiglu"))) for _ in range(LAYERS)]).to(dtype)


def inputs(step, dtype):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(B, S, HIDDEN, generator=g).to(dtype)


def loss_of(model, x):
    return model(x).float().square().mean()


def storage_of(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage().untyped()


def assert_same_grads(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert p.grad is not None and torch.equal(p.grad, q.grad), name


def train_side_by_side(kind, dtype, steps, block=Block, **kw):
    """Trains a plain model and a copy under recompute_activations on the same data with the same
    generator state; asserts equal losses and gradients at every step. Returns (plain, wrapped, handle)."""
    plain = make(kind, dtype, block=block)
    wrapped = copy.deepcopy(plain)
    handle = recompute_activations(wrapped, **kw)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, wrapped)]
    for step in range(steps):
        x = inputs(step, dtype)
        losses = []
        for model, opt in zip((plain, wrapped), opts):
            opt.zero_grad()
            torch.manual_seed(step)  # the same dropout masks on both sides
            loss = loss_of(model, x)
            loss.backward()
            losses.append(loss)
        assert torch.equal(losses[0], losses[1]), step
        assert_same_grads(plain, wrapped)
        for opt in opts:
            opt.step()
    return plain, wrapped, handle


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["gelu", "silu", "gelu_general", "swiglu", "swiglu_known"])
def test_losses_and_gradients_are_bit_identical_over_sgd_steps(kind, dtype):
    types = {"gelu": (nn.GELU,), "silu": (nn.SiLU,), "gelu_general": (GeneralGelu,), "swiglu": (SwiGLU,),
             "swiglu_known": (gpt.SwiGLU,)}[kind]
    _, wrapped, handle = train_side_by_side(kind, dtype, steps=4, activation_types=types)
    itemsize = torch.tensor([], dtype=dtype).element_size()
    assert handle.stats.bytes_released == LAYERS * TOKENS * INTER * itemsize
    assert handle.stats.activations_released == LAYERS
    assert handle.stats.recomputations == 4 * LAYERS
    assert len(handle.modules) == LAYERS


@pytest.mark.parametrize("block", [InplaceResidual, SharedTwice])
def test_in_place_on_the_parent_output_and_a_parent_run_twice(block):
    _, _, handle = train_side_by_side("gelu", torch.float32, steps=2, block=block)
    calls = 2 if block is SharedTwice else 1
    assert handle.stats.activations_released == calls * LAYERS
    assert handle.stats.recomputations == 2 * calls * LAYERS


def test_dropout_inside_the_activation_is_replayed_bit_for_bit():
    train_side_by_side("dropout", torch.float32, steps=3, activation_types=(GeluDropout,))


def test_without_rng_replay_the_dropout_gradients_would_differ(monkeypatch):
    # The control for the test above: it can fail.
    monkeypatch.setattr(rc, "_replayed_rng", lambda device, state: contextlib.nullcontext())
    with pytest.raises(AssertionError):
        train_side_by_side("dropout", torch.float32, steps=1, activation_types=(GeluDropout,))


def test_recomputation_leaves_the_training_generator_where_it_was():
    draws = []
    for wrap in (False, True):
        model = make("dropout")
        if wrap:
            recompute_activations(model, activation_types=(GeluDropout,))
        torch.manual_seed(7)
        loss_of(model, inputs(0, torch.float32)).backward()
        draws.append(torch.rand(4))
    assert torch.equal(draws[0], draws[1])


def saved_bytes_and_grads(model, x):
    """Bytes of the distinct storages autograd holds for backward, counted when forward has
    finished (the peak of a training step): every saved tensor goes through the pack hook."""
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        loss = loss_of(model, x)
    storages = {}
    for t in packed:
        s = storage_of(t)
        if s.data_ptr():  # a released storage has no bytes and no address
            storages[s.data_ptr()] = s.nbytes()
    loss.backward()
    return sum(storages.values()), loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["gelu", "swiglu", "swiglu_known"])
def test_saved_bytes_drop_by_the_released_activations(kind, dtype):
    plain = make(kind, dtype)
    wrapped = copy.deepcopy(plain)
    handle = recompute_activations(wrapped, activation_types=(nn.GELU, SwiGLU, gpt.SwiGLU))
    x = inputs(0, dtype)
    before, loss0 = saved_bytes_and_grads(plain, x)
    after, loss1 = saved_bytes_and_grads(wrapped, x)
    out = TOKENS * INTER * torch.tensor([], dtype=dtype).element_size()  # one activation output
    # GeLU saves its input (fc1's output) either way; fc2's saved copy of the output is released.
    # SwiGLU: the input (both halves) is saved either way; released are the output and silu(gate),
    # which the plain model saves for the product's backward.
    per_layer = out if kind == "gelu" else 2 * out
    assert before - after == LAYERS * per_layer
    assert handle.stats.bytes_released == LAYERS * out
    assert torch.equal(loss0, loss1)
    assert_same_grads(plain, wrapped)


def test_remove_restores_the_model():
    plain = make("gelu")
    wrapped = copy.deepcopy(plain)
    handle = recompute_activations(wrapped)
    loss_of(wrapped, inputs(0, torch.float32)).backward()
    handle.remove()
    assert all("forward" not in m.__dict__ for m in wrapped.modules())
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in wrapped.modules())
    wrapped.zero_grad()
    before, loss0 = saved_bytes_and_grads(plain, inputs(1, torch.float32))
    after, loss1 = saved_bytes_and_grads(wrapped, inputs(1, torch.float32))
    assert before == after and torch.equal(loss0, loss1)
    assert_same_grads(plain, wrapped)
    assert handle.stats.recomputations == LAYERS  # only the wrapped step
    handle.remove()  # twice is harmless


@pytest.mark.parametrize("kind", ["gelu", "gelu_general", "swiglu_known"])
def test_backward_twice_with_retain_graph_recomputes_each_time(kind):
    plain = make(kind)
    wrapped = copy.deepcopy(plain)
    handle = recompute_activations(wrapped, activation_types=(nn.GELU, GeneralGelu, gpt.SwiGLU))
    x = inputs(0, torch.float32)
    for model in (plain, wrapped):
        loss = loss_of(model, x)
        loss.backward(retain_graph=True)
        loss.backward()  # the activations stay restored; a general one's graph is rebuilt
        with pytest.raises(RuntimeError, match="second time"):
            loss.backward()
    assert_same_grads(plain, wrapped)
    # A known activation reruns once, into its storage; its backward needs no graph (the second
    # one recomputes silu(gate) inside SwiGLU's recompute_backward: _known_activations).
    assert handle.stats.recomputations == (2 * LAYERS if kind == "gelu_general" else LAYERS)


def test_no_grad_forward_releases_nothing():
    plain = make("gelu")
    wrapped = copy.deepcopy(plain)
    handle = recompute_activations(wrapped)
    x = inputs(0, torch.float32)
    with torch.no_grad():
        y0, y1 = plain(x), wrapped(x)
    assert torch.equal(y0, y1)
    assert handle.stats.bytes_released == 0 and handle.stats.recomputations == 0
    loss_of(wrapped, x)  # a training forward after it releases as usual
    assert handle.stats.bytes_released == LAYERS * TOKENS * INTER * 4


def test_autocast_is_replayed():
    class ProjGelu(nn.Module):  # a linear inside the recomputed function: autocast changes its dtype
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(INTER, INTER)

        def forward(self, x):
            return F.gelu(self.proj(x))

    torch.manual_seed(0)
    plain = nn.Sequential(Block(MLP(ProjGelu())))
    wrapped = copy.deepcopy(plain)
    handle = recompute_activations(wrapped, activation_types=(ProjGelu,))
    x = inputs(0, torch.float32)
    losses = []
    for model in (plain, wrapped):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_of(model, x)
        loss.backward()  # outside autocast, as usual
        losses.append(loss)
    assert torch.equal(*losses)
    assert_same_grads(plain, wrapped)
    assert handle.stats.bytes_released == TOKENS * INTER * 2  # bf16 output


@pytest.mark.parametrize("fn", [F.gelu, F.silu, lambda x: F.gelu(x)], ids=["gelu", "silu", "general"])
def test_low_level_release_and_recompute(fn):
    torch.manual_seed(0)
    h = torch.randn(TOKENS, INTER, requires_grad=True)
    w = torch.randn(HIDDEN, INTER, requires_grad=True)
    ref_a = fn(h)
    ref = (ref_a @ w.t()).square().sum()
    ref_grads = torch.autograd.grad(ref, (h, w))

    act = ReleasedActivation()
    a = act.checkpoint(fn, h)
    assert torch.equal(a, ref_a) and a.requires_grad
    y = a @ w.t()  # the consumer saves a
    act.release()
    assert storage_of(a).nbytes() == 0 and a.shape == (TOKENS, INTER)
    assert act.released_bytes == TOKENS * INTER * 4
    act.register_recompute(y)
    grads = torch.autograd.grad(y.square().sum(), (h, w))
    assert torch.equal(a, ref_a)  # the same storage has the bytes back
    assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads))
    assert act.stats.recomputations == 1


def test_a_released_output_is_restored_even_when_nothing_needs_its_gradient():
    # Frozen input: no backward node for the activation, but the consumer still saved its output.
    h = torch.randn(TOKENS, INTER)
    w = torch.randn(HIDDEN, INTER, requires_grad=True)
    ref = torch.autograd.grad((F.gelu(h) @ w.t()).square().sum(), w)[0]
    act = ReleasedActivation()
    a = act.checkpoint(F.gelu, h)
    y = a @ w.t()
    act.release()
    act.register_recompute(y)
    assert torch.equal(torch.autograd.grad(y.square().sum(), w)[0], ref)


def test_aliased_outputs_are_refused():
    h = torch.randn(TOKENS, INTER, requires_grad=True) * 1

    def refused(fn, match, at_release=True):
        act = ReleasedActivation()
        if not at_release:
            with pytest.raises(InvalidArgumentError, match=match):
                act.checkpoint(fn, h)
            return
        a = act.checkpoint(fn, h)
        with pytest.raises(InvalidArgumentError, match=match) as e:
            act.release()
        assert isinstance(e.value, StowageError)
        assert storage_of(a).nbytes() > 0  # nothing was released

    refused(lambda x: F.gelu(x).view(-1), "is a view")
    refused(lambda x: F.gelu(x)[:, :4], "is a view")
    buffer = torch.zeros(2 * TOKENS * INTER)
    refused(lambda x: torch.empty(0).set_(storage_of(buffer) if hasattr(buffer, "untyped_storage") else
                                          buffer.storage(), 0, x.shape).copy_(F.gelu(x)), "not its whole storage")
    refused(lambda x: x.relu_(), "shares storage with its input", at_release=False)

    act = ReleasedActivation()
    a = act.checkpoint(F.gelu, h)
    a.mul_(2)
    with pytest.raises(InvalidArgumentError, match="modified in place"):
        act.release()


def test_module_level_refusals():
    with pytest.raises(InvalidArgumentError, match="in-place"):
        recompute_activations(nn.Sequential(nn.Linear(4, 4), nn.SiLU(inplace=True)))
    with pytest.raises(InvalidArgumentError, match="no module named nope"):
        recompute_activations(nn.Sequential(nn.Linear(4, 4)), names=("nope",))

    class Leaky(MLP):  # returns the activation itself next to the result
        def forward(self, x):
            a = self.act(self.fc1(x))
            return self.fc2(a), a

    model = Leaky(nn.GELU())
    recompute_activations(model, names=("act",))  # by name
    with pytest.raises(InvalidArgumentError, match="shares storage with\\) an output"):
        model(torch.randn(TOKENS, HIDDEN))


def test_non_tensor_arguments_pass_through():
    h = torch.randn(TOKENS, INTER, requires_grad=True)
    w = torch.randn(HIDDEN, INTER, requires_grad=True)

    def fn(x, scale, approximate, nothing):
        assert nothing is None
        return F.gelu(x * scale, approximate=approximate)

    ref = torch.autograd.grad((fn(h, 0.5, "tanh", None) @ w.t()).square().sum(), (h, w))
    act = ReleasedActivation()
    y = act.checkpoint(fn, h, 0.5, "tanh", None) @ w.t()
    act.release()
    act.register_recompute(y)
    got = torch.autograd.grad(y.square().sum(), (h, w))
    assert all(torch.equal(g, r) for g, r in zip(got, ref))


def test_activations_with_parameters_or_forward_hooks_are_refused_and_handles_undo_in_order():
    from stowage.torch.swap import swap_activations

    class Block(torch.nn.Module):
        def __init__(self, act):
            super().__init__()
            self.fc, self.act = torch.nn.Linear(4, 4), act

        def forward(self, x):
            return self.fc(self.act(x))

    prelu = Block(torch.nn.PReLU())
    with recompute_activations(prelu, names=("act",)):
        with pytest.raises(InvalidArgumentError, match="has parameters that train but no input"):
            prelu(torch.randn(2, 4))  # plain PyTorch would train act.weight here; a released output cannot
    block = Block(torch.nn.GELU())
    hook = block.act.register_forward_hook(lambda m, i, o: None)
    with pytest.raises(InvalidArgumentError, match="forward hooks"):
        recompute_activations(block)
    assert "forward" not in block.act.__dict__
    hook.remove()
    handle = recompute_activations(block)
    hook = block.act.register_forward_hook(lambda m, i, o: None)  # added after wrapping: refused at forward
    with pytest.raises(InvalidArgumentError, match="forward hooks"):
        block(torch.randn(2, 4, requires_grad=True))
    hook.remove()
    # Two wrappers on one module: undone only in reverse order, and a refusal undoes nothing.
    outer = swap_activations(block, names=("",))
    with pytest.raises(InvalidArgumentError, match="reverse order"):
        handle.remove()
    outer.remove()
    handle.remove()
    assert "forward" not in block.__dict__ and "forward" not in block.act.__dict__


class FunctionalSwiGLU(nn.Module):
    """As Llama's code writes it: the activation is a function call, no module."""

    def __init__(self):
        super().__init__()
        self.w1, self.w3, self.w2 = nn.Linear(HIDDEN, INTER), nn.Linear(HIDDEN, INTER), nn.Linear(INTER, HIDDEN)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def test_a_model_without_activation_modules_is_refused_as_swap_refuses_one_without_attention():
    from stowage.torch.adaptor import apply
    model = nn.Sequential(FunctionalSwiGLU(), FunctionalSwiGLU())
    unchanged = [(m.__dict__.get("forward"), dict(m._forward_pre_hooks)) for m in model.modules()]
    with pytest.raises(InvalidArgumentError, match=r"no module was chosen \(no instance of GELU, SiLU, no names "
                                                   r"given\).*F.silu.*activation_types.*names"):
        recompute_activations(model)
    with pytest.raises(InvalidArgumentError, match=r"activation_types empty"):
        recompute_activations(model, activation_types=())
    # apply(recompute=True) passes the refusal on, and leaves the model as it was.
    with pytest.raises(InvalidArgumentError, match="no module was chosen"):
        apply(model, torch.optim.SGD(model.parameters(), lr=0.1), shared_storage=False, recompute=True)
    assert [(m.__dict__.get("forward"), dict(m._forward_pre_hooks)) for m in model.modules()] == unchanged
    assert all(p.dtype == torch.float32 for p in model.parameters())
    # Named, the module-level activation the refusal asks for works.
    handle = recompute_activations(make("swiglu"), names=("0.mlp.act",))
    assert handle.modules == ["0.mlp.act"]


def test_a_deep_copy_or_pickle_of_a_wrapped_model_is_a_plain_model_on_its_own_weights():
    """EMA copies (copy.deepcopy) and torch.save(model): the copy computes with its own weights and
    recomputes nothing; the original keeps recomputing, and its stats ("last forward") are not
    reset by the copy's forwards."""
    model = make("gelu")
    handle = recompute_activations(model)
    x = inputs(0, torch.float32)
    loss = loss_of(model, x)  # the original's forward: its activations released, backward pending
    assert handle.stats.activations_released == LAYERS
    ema = copy.deepcopy(model)
    loaded = loaded_without_stowage(model)
    for copied in (ema, loaded):
        with torch.no_grad():
            for p in copied.parameters():
                p.mul_(0.5)
        reference = make("gelu", seed=1)
        reference.load_state_dict(copied.state_dict())
        copy_loss, ref_loss = loss_of(copied, x), loss_of(reference, x)
        copy_loss.backward()
        ref_loss.backward()
        assert torch.equal(copy_loss, ref_loss) and not torch.equal(copy_loss, loss)
        assert_same_grads(copied, reference)
        assert handle.stats.activations_released == LAYERS and handle.stats.recomputations == 0
    loss.backward()  # the original's backward recomputes its own activations
    assert handle.stats.recomputations == LAYERS
    plain = make("gelu")
    assert torch.equal(loss, loss_of(plain, x))
    handle.remove()
    assert all("forward" not in m.__dict__ for m in model.modules())


class LoopedMLP(nn.Module):
    """Activations held in an nn.ModuleList, which has no forward: the model's own forward loops
    over them (their caller is the model, not the list)."""

    def __init__(self, act=nn.GELU):
        super().__init__()
        self.fcs = nn.ModuleList([nn.Linear(HIDDEN, INTER), nn.Linear(INTER, HIDDEN), nn.Linear(HIDDEN, INTER)])
        self.acts = nn.ModuleList([act(), act(), act()])
        self.out = nn.Linear(INTER, HIDDEN)

    def forward(self, x):
        for fc, act in zip(self.fcs, self.acts):
            x = act(fc(x))
        return self.out(x)


@pytest.mark.parametrize("act", [nn.GELU, GeneralGelu])
def test_activations_in_a_module_list_are_released_by_the_module_that_loops_over_them(act):
    torch.manual_seed(0)
    plain = LoopedMLP(act)
    wrapped = copy.deepcopy(plain)
    handle = recompute_activations(wrapped, activation_types=(act,))
    assert handle.modules == ["acts.0", "acts.1", "acts.2"]
    x = inputs(0, torch.float32)
    loss, ref = loss_of(wrapped, x), loss_of(plain, x)
    assert handle.stats.activations_released == 3
    assert handle.stats.bytes_released == 4 * TOKENS * (INTER + HIDDEN + INTER)
    loss.backward()
    ref.backward()
    # Three restored by one hook. A general activation's graph is then rebuilt in its own backward
    # (a second rerun each); nn.GELU's backward needs none.
    assert torch.equal(loss, ref) and handle.stats.recomputations == (3 if act is nn.GELU else 6)
    assert_same_grads(wrapped, plain)
    handle.remove()
    assert all("forward" not in m.__dict__ for m in wrapped.modules())


def test_an_activation_run_outside_the_module_that_holds_it_warns_that_nothing_is_released():
    torch.manual_seed(0)
    holder = nn.Sequential(nn.Linear(HIDDEN, INTER), nn.GELU())
    handle = recompute_activations(holder)
    h = holder[0](inputs(0, torch.float32))
    with pytest.warns(UserWarning, match="1 ran outside the forward of the module that holds it") as caught:
        holder[1](h)  # called by the user, not by holder's forward
    assert caught[0].filename == __file__  # the warning points at the user's line
    assert handle.stats.activations_released == 0
    handle.remove()


def test_a_gradient_of_a_gradient_is_refused_rather_than_computed_without_its_second_order_terms():
    """A gradient penalty (WGAN-GP, R1): autograd.grad(create_graph=True), then backward of a loss
    on that gradient. The recomputed graph starts at detached inputs, so the parameters' gradients
    came out wrong (some None) with no error. Refused now; plain backward goes on working."""
    model = make("gelu", torch.float64)
    handle = recompute_activations(model)
    x = inputs(0, torch.float64).requires_grad_()
    out = model(x).sum()
    with pytest.raises(UnsupportedError, match="create_graph=True .*second-order terms would be lost"):
        torch.autograd.grad(out, x, create_graph=True)
    plain = make("gelu", torch.float64)
    loss, ref = loss_of(model, x), loss_of(plain, x)
    loss.backward()
    ref.backward()
    assert_same_grads(model, plain)
    handle.remove()  # without recomputation the penalty is torch's
    gx, = torch.autograd.grad(model(x).sum(), x, create_graph=True)
    gx.square().sum().backward()


class SharedActMLP(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(HIDDEN, INTER), act, nn.Linear(INTER, HIDDEN)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(x)))


class OneActForAll(nn.Module):
    """self.act built once on the model and handed to every layer (codebases that build
    ACT2FN[...] once do this): named_modules() lists it once, as "act"."""

    def __init__(self):
        super().__init__()
        self.act = nn.GELU()
        self.blocks = nn.ModuleList([SharedActMLP(self.act) for _ in range(LAYERS)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


@pytest.mark.parametrize("names", [(), ("blocks.1.act",)], ids=["by-type", "by-a-layers-name"])
def test_an_activation_instance_shared_by_every_layer_is_released_by_each_layer_that_calls_it(names):
    torch.manual_seed(0)
    plain = OneActForAll()
    model = copy.deepcopy(plain)
    handle = recompute_activations(model, names=names, **({"activation_types": ()} if names else {}))
    assert handle.modules == (list(names) or ["act"])
    x = inputs(0, torch.float32)
    seen = []
    model.blocks[0].register_forward_hook(lambda *_: seen.append(handle.stats.activations_released))
    loss, ref = loss_of(model, x), loss_of(plain, x)
    # Released when each layer returns (each layer is a caller), not all at the model's return.
    assert seen == [1] and handle.stats.activations_released == LAYERS
    loss.backward()
    ref.backward()
    assert torch.equal(loss, ref) and handle.stats.recomputations == LAYERS  # one rerun each
    assert_same_grads(model, plain)
    handle.remove()
    assert all("forward" not in m.__dict__ for m in model.modules())


class LoopedActs(nn.Module):
    """The model runs every activation itself: one parent for all of them."""

    def __init__(self, act=nn.GELU, layers=4, hidden=64, inter=256):
        super().__init__()
        self.fc1 = nn.ModuleList([nn.Linear(hidden, inter) for _ in range(layers)])
        self.acts = nn.ModuleList([act() for _ in range(layers)])
        self.fc2 = nn.ModuleList([nn.Linear(inter, hidden) for _ in range(layers)])

    def forward(self, x):
        for fc1, act, fc2 in zip(self.fc1, self.acts, self.fc2):
            x = x + fc2(act(fc1(x)))
        return x


class LayeredActs(LoopedActs):
    """The same layers, each with its own parent."""

    def __init__(self, act=nn.GELU):
        super().__init__()
        self.layers = nn.ModuleList([SharedActMLP(act()) for _ in range(4)])
        for layer, fc1, fc2 in zip(self.layers, self.fc1, self.fc2):
            layer.fc1, layer.fc2 = fc1, fc2
        del self.fc1, self.fc2, self.acts

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("parents", ["one-for-all", "one-per-layer"])
def test_measured_bytes_at_the_boundary_drop_by_the_released_outputs_and_backward_adds_at_most_one(parents):
    """Bytes live in torch's allocator (every allocation and free the profiler records), for a
    general activation (a rerun with a graph). At the forward/backward boundary: the plain model's
    less each released output, plus the generator state each released call keeps for its replay.
    During backward: a parent that runs several activations restores them together when its
    output's gradient arrives; each graph is rebuilt in its own backward, so the peak is at most
    the plain model's plus one output (before: plus every output, each held twice until its
    backward ran). One parent per layer restores one at a time: the backward peak is lower than
    the plain model's."""
    torch.manual_seed(0)
    plain = LoopedActs(GeneralGelu) if parents == "one-for-all" else LayeredActs(GeneralGelu)
    model = copy.deepcopy(plain)
    handle = recompute_activations(model, activation_types=(GeneralGelu,))
    x = torch.randn(512, 64)
    base = forward_backward_bytes(lambda: plain(x).square().mean(), lambda loss: loss.backward())
    mine = forward_backward_bytes(lambda: model(x).square().mean(), lambda loss: loss.backward())
    output, rng = 512 * 256 * 4, torch.get_rng_state().numel()
    assert handle.stats.activations_released == 4 and handle.stats.bytes_released == 4 * output
    assert mine[0] == base[0] - 4 * output + 4 * rng
    if parents == "one-for-all":
        assert base[1] < mine[1] <= base[1] + output + 4 * rng
    else:
        assert mine[1] < base[1]
    assert_same_grads(model, plain)


@pytest.mark.parametrize("parents", ["one-for-all", "one-per-layer"])
def test_a_known_activation_is_restored_into_its_own_bytes_and_keeps_no_generator_state(parents):
    """nn.GELU (_known_activations): the restore writes into the released storage and backward
    runs torch's gelu_backward on the saved input, so nothing is allocated that the plain model
    would not hold: at the boundary exactly the released outputs less (no generator state, GeLU
    draws no numbers), and the backward peak is the plain model's at most (one parent restores
    all four at once: exactly its peak) or below it (a parent per layer restores one at a time)."""
    torch.manual_seed(0)
    plain = LoopedActs() if parents == "one-for-all" else LayeredActs()
    model = copy.deepcopy(plain)
    handle = recompute_activations(model)
    x = torch.randn(512, 64)
    base = forward_backward_bytes(lambda: plain(x).square().mean(), lambda loss: loss.backward())
    mine = forward_backward_bytes(lambda: model(x).square().mean(), lambda loss: loss.backward())
    output = 512 * 256 * 4
    assert handle.stats.activations_released == 4 and handle.stats.bytes_released == 4 * output
    assert handle.stats.recomputations == 4
    assert mine[0] == base[0] - 4 * output
    if parents == "one-for-all":
        assert mine[1] == base[1]
    else:
        assert mine[1] < base[1]
    assert_same_grads(model, plain)


@dataclasses.dataclass
class MLPOut:
    hidden: torch.Tensor
    aux: int = 0


class DataclassMLP(SharedActMLP):
    def forward(self, x):
        return MLPOut(super().forward(x))


class Opaque:
    def __init__(self, t):
        self.t = t


class OpaqueMLP(SharedActMLP):
    def forward(self, x):
        return Opaque(super().forward(x))


def test_a_parent_returning_a_dataclass_releases_and_an_opaque_container_warns():
    torch.manual_seed(0)
    model = nn.ModuleList([DataclassMLP(nn.GELU()) for _ in range(2)])
    plain = copy.deepcopy(model)
    handle = recompute_activations(model)
    x = inputs(0, torch.float32)

    def run(m):
        h = x
        for layer in m:
            h = layer(h).hidden
        return h.square().mean()
    loss, ref = run(model), run(plain)
    assert handle.stats.activations_released == 2
    loss.backward()
    ref.backward()
    assert torch.equal(loss, ref) and handle.stats.recomputations == 2
    assert_same_grads(model, plain)
    opaque = OpaqueMLP(nn.GELU())
    handle = recompute_activations(opaque)
    with pytest.warns(UserWarning, match="a OpaqueMLP returned a Opaque with no tensor in it that stowage can find"):
        opaque(x)
    assert handle.stats.activations_released == 0


class Cyclic(nn.Module):
    """A submodule that holds its ancestor (a back reference some codebases register)."""

    def __init__(self):
        super().__init__()
        self.mlp = SharedActMLP(nn.GELU())
        self.mlp.owner = nn.ModuleList([self])  # a cycle through _modules

    def forward(self, x):
        return self.mlp(x)


def test_a_module_graph_with_a_cycle_is_walked_once_per_path():
    torch.manual_seed(0)
    model = Cyclic()
    handle = recompute_activations(model)  # named_modules(remove_duplicate=False) recursed for ever
    assert handle.modules == ["mlp.act"]
    x = inputs(0, torch.float32)
    model(x).square().mean().backward()
    assert handle.stats.activations_released == 1 and handle.stats.recomputations == 1
    handle.remove()


class TwoOutputsOneShared(nn.Module):
    """Two activations in one parent; the second's output is also returned (cannot be released)."""

    def __init__(self):
        super().__init__()
        self.fc, self.a1, self.a2 = nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.GELU()

    def forward(self, x):
        h = self.fc(self.a1(x))
        return self.fc(h) + 1, self.a2(h)


def test_a_refusal_among_several_activations_releases_none_of_them():
    model = TwoOutputsOneShared()
    handle = recompute_activations(model)
    x = inputs(0, torch.float32).requires_grad_()
    with pytest.raises(InvalidArgumentError, match="a2's output is .*an output of its parent"):
        model(x)
    assert handle.stats.activations_released == 0  # a1's was not released without its hook


class HalfProtocol(nn.Module):
    def forward(self, x):
        return F.gelu(x)

    def recompute_into(self, out, x):
        torch._C._nn.gelu(x, out=out)


def test_half_of_the_recompute_protocol_is_refused_at_the_first_forward():
    model = make("gelu")
    for block in model:
        block.mlp.act = HalfProtocol()
    recompute_activations(model, activation_types=(HalfProtocol,))
    with pytest.raises(InvalidArgumentError, match="recompute_backward"):
        loss_of(model, inputs(0, torch.float32))


class GeGLU(gpt.SwiGLU):
    """Overrides forward but inherits SwiGLU's protocol, which describes the parent's forward."""

    def forward(self, x):
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate) * up


class ScaledSiLU(gpt.SwiGLU):
    """The protocol with a parameter that trains: its gradient flows only through a graph."""

    def __init__(self):
        super().__init__()
        self.beta = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate * self.beta) * up

    def recompute_into(self, out, x):
        torch.mul(F.silu(x.chunk(2, dim=-1)[0] * self.beta), x.chunk(2, dim=-1)[1], out=out)

    def recompute_backward(self, grad, kept, x):
        raise AssertionError("not used: beta trains")


class DropoutSwiGLU(gpt.SwiGLU):
    """The protocol over a forward that draws numbers: recompute_into must see the same mask."""

    def forward(self, x):
        return F.dropout(super().forward(x), p=0.3)

    def recompute_into(self, out, x):
        out.copy_(F.dropout(super().forward(x), p=0.3))

    def recompute_backward(self, grad, kept, x):
        raise AssertionError("not reached: the test compares the restored bytes")


@pytest.mark.parametrize("act", [GeGLU, ScaledSiLU], ids=["forward-overridden", "parameter-trains"])
def test_a_protocol_that_does_not_describe_the_module_takes_the_general_path(act):
    torch.manual_seed(0)
    plain = nn.Sequential(*[Block(MLP(act(), gated=True)) for _ in range(LAYERS)])
    wrapped = copy.deepcopy(plain)
    handle = recompute_activations(wrapped, activation_types=(act,))
    x = inputs(0, torch.float32)
    loss, ref = loss_of(wrapped, x), loss_of(plain, x)
    loss.backward()
    ref.backward()
    assert torch.equal(loss, ref) and handle.stats.activations_released == LAYERS
    assert_same_grads(wrapped, plain)  # beta's included
    assert handle.stats.recomputations == LAYERS  # the general path's one rerun, its graph kept


def test_a_protocol_module_restores_under_the_forwards_generator_state():
    torch.manual_seed(0)
    h = torch.randn(TOKENS, 2 * INTER, requires_grad=True)
    w = torch.randn(HIDDEN, INTER, requires_grad=True)
    act_module = DropoutSwiGLU()
    act = ReleasedActivation()
    torch.manual_seed(7)
    a = act.checkpoint(act_module.forward, h)
    expected = a.clone()
    y = a @ w.t()
    act.release()
    torch.rand(100)  # the training loop's generator moves on
    act._recompute(graph=False)  # what the hook does
    assert torch.equal(a, expected)


def test_replaced_gelu_and_silu_are_not_taken_for_torchs(monkeypatch):
    from stowage.torch._known_activations import known_activation
    x = torch.randn(3, 4)
    assert known_activation(nn.GELU().forward, (x,)) is not None
    assert known_activation(nn.SiLU().forward, (x,)) is not None
    monkeypatch.setattr(F, "gelu", lambda t, approximate="none": torch.tanh(t))
    monkeypatch.setattr(F, "silu", lambda t, inplace=False: torch.sigmoid(t))
    assert known_activation(nn.GELU().forward, (x,)) is None and known_activation(F.gelu, (x,)) is None
    assert known_activation(nn.SiLU().forward, (x,)) is None and known_activation(F.silu, (x,)) is None
    # And end to end: the replaced function's gradients, not gelu_backward's.
    plain = make("gelu")
    wrapped = copy.deepcopy(plain)
    recompute_activations(wrapped)
    x = inputs(0, torch.float32)
    loss, ref = loss_of(wrapped, x), loss_of(plain, x)
    loss.backward()
    ref.backward()
    assert torch.equal(loss, ref)
    assert_same_grads(wrapped, plain)


class SwiGLUMLP(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(64, 512), act, nn.Linear(256, 64)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_swiglu_through_the_protocol_peaks_one_output_below_the_general_path():
    """Measured bytes (memory_trace): at the boundary both paths hold the plain model's less the
    output and silu(gate); in backward the protocol path holds the kept silu(gate) while it writes
    the product's gradients into the input's gradient (one output above the plain model's peak),
    the general path the rerun graph's output besides (two above). Both keep the generator state
    (a protocol module may draw numbers)."""
    torch.manual_seed(0)
    x = torch.randn(512, 64)
    output, rng = 512 * 256 * 4, torch.get_rng_state().numel()
    peaks = {}
    for name, act in (("plain", gpt.SwiGLU), ("protocol", gpt.SwiGLU), ("general", SwiGLU)):
        torch.manual_seed(0)
        model = SwiGLUMLP(act())
        if name != "plain":
            recompute_activations(model, activation_types=(act,))
        peaks[name] = forward_backward_bytes(lambda: model(x).square().mean(), lambda loss: loss.backward())
    assert peaks["protocol"][0] == peaks["general"][0] == peaks["plain"][0] - 2 * output + rng
    assert peaks["protocol"][1] == peaks["general"][1] - output
    assert peaks["protocol"][1] <= peaks["plain"][1] + output + rng


class _GeluDropout(torch.nn.Module):
    """An activation with dropout inside: the general path, which replays the generator."""

    def forward(self, x):
        return torch.nn.functional.dropout(torch.nn.functional.gelu(x), 0.3, self.training)


def _gelu_dropout_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), _GeluDropout(), torch.nn.Linear(32, 8))


def test_the_rerun_keeps_the_forwards_train_mode_when_eval_comes_before_backward():
    """model.eval() between forward and backward (an evaluation callback) reran the dropout as the
    identity: other gradients, silently. The rerun takes the modes the forward had."""
    grads = []
    for recompute in (False, True):
        model = _gelu_dropout_mlp()
        if recompute:
            recompute_activations(model, activation_types=(_GeluDropout,))
        torch.manual_seed(1)
        loss = model(torch.randn(4, 8)).sum()
        model.eval()
        loss.backward()
        assert not model[1].training  # the mode the caller set stays
        grads.append(model[0].weight.grad)
    assert torch.equal(grads[0], grads[1])


def test_an_empty_batch_through_a_permuted_output_runs_as_without_recompute():
    """An output with no elements holds no bytes, whatever its strides: nothing to refuse."""
    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = torch.nn.Linear(16, 48), torch.nn.GELU(), torch.nn.Linear(48, 16)
            self.w = torch.nn.Parameter(torch.randn(48))

        def forward(self, x):  # (batch, seq, hidden), the activation in a seq-first layout
            return self.fc2((self.act(self.fc1(x).transpose(0, 1)) * self.w).transpose(0, 1))
    model = MLP()
    recompute_activations(model)
    for batch in (4, 0):
        x = torch.randn(batch, 8, 16, requires_grad=True)
        model(x).sum().backward()
        assert x.grad.shape == (batch, 8, 16)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # gpt.py's own, as for the plain model
def test_torch_jit_trace_of_a_recomputing_model_records_the_plain_graph():
    """Under torch.jit.trace (grad enabled, train mode) the wrapped activations run as they are:
    the trace recorded each rerun's checkpoint before, and its check failed ("Graphs differed
    across invocations"). The traced code is the plain model's, and its output the eager one."""
    torch.manual_seed(0)
    plain = gpt.GPT(20, 8)
    wrapped = copy.deepcopy(plain)
    handle = recompute_activations(wrapped)
    x = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(1))
    traced, traced_plain = torch.jit.trace(wrapped, x), torch.jit.trace(plain, x)  # each checks its trace by rerunning
    assert handle.stats.activations_released == 0  # nothing released while tracing
    names = [name for name, _ in wrapped.named_modules()]
    code = {name: getattr(m, "code", None) for name, m in traced.named_modules()}  # None: no forward (ModuleList)
    assert code == {name: getattr(m, "code", None) for name, m in traced_plain.named_modules()}
    assert list(code) == names and code["blocks.0.mlp.act"] is not None
    out = traced(x)
    eager = wrapped(x)  # a training forward: the activations are released
    assert handle.stats.activations_released == len(handle.modules) > 0
    assert torch.equal(out, eager) and torch.equal(out, plain(x))
    handle.remove()
