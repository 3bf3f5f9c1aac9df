"""The small GPT trained with every configuration of stowage.torch.apply(): the same losses bit
for bit as plain PyTorch, and each technique lowers the bytes live at the forward/backward
boundary by what it was predicted to (measured on the CPU tensors themselves)."""
import json

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage import InvalidArgumentError, UnsupportedError  # noqa: E402
from stowage.torch import demo, gpt  # noqa: E402
from stowage.torch.adaptor import apply  # noqa: E402

B, S, FFN, LAYERS, HIDDEN, HEADS = 4, 32, 256, 2, 64, 4
# Swap and offload move bytes to host memory, on the CPU stowage's (an emulated device's).
emulated = pytest.mark.skipif(stowage.using_cuda(), reason="the CPU demo's host memory is stowage's emulated "
                                                           "device; this libstowage uses CUDA")


@pytest.fixture(scope="module")
def results():
    return {c: demo.run(c, steps=6, seq=S, batch=B, layers=LAYERS, ffn=FFN) for c in demo.CONFIGS}


def test_every_configuration_has_the_baselines_losses_bit_for_bit(results):
    base = results["baseline"]["losses"]
    assert len(base) == 6 and base[-1] < base[0]  # it trains
    for c in demo.CONFIGS:
        assert results[c]["losses"] == base, c


def test_shared_storage_saves_two_bytes_per_parameter_less_the_tie_bitmap(results):
    n = results["baseline"]["parameters"]
    assert results["baseline"]["weight_bytes"] == 6 * n  # fp32 master + bf16 copy
    assert results["shared"]["weight_bytes"] == 4 * n + n // 8  # planes + ties (no padding: all multiples of 64)
    saved = results["baseline"]["boundary_bytes"] - results["shared"]["boundary_bytes"]
    assert saved == results["shared"]["predicted_saving_bytes"] == 2 * n - n // 8


def test_recompute_releases_each_mlp_activation_output(results):
    # Layer 0 is GeLU: its output (b·s·ffn bf16). Layer 1 is SwiGLU: its output and silu(gate),
    # which the multiplication saved, are both gone; fc1's output was saved either way.
    per = B * S * FFN * 2
    saved = results["baseline"]["saved_activation_bytes"] - results["recompute"]["saved_activation_bytes"]
    assert saved == per + 2 * per
    assert saved >= results["recompute"]["predicted_saving_bytes"] == LAYERS * per


def attention_storages():
    """Bytes of the distinct storages the attention modules save for backward in one forward of
    the demo's (bf16) model, parameters' storages aside: what swapping them takes off the boundary."""
    data, vocab = gpt.batches(gpt.corpus(), S, B, 1, seed=1)
    torch.manual_seed(0)
    model = gpt.GPT(vocab, S, hidden=HIDDEN, layers=LAYERS, ffn=FFN).to(torch.bfloat16)
    meter = demo.SavedBytes(model.parameters())
    for block in model.blocks:
        original = block.attn.forward

        def forward(*args, __original=original):
            with meter.hooks():
                return __original(*args)
        block.attn.forward = forward
    out = model(data[0][0])
    return meter.bytes(), out


@emulated
def test_swap_takes_what_attention_saves_off_the_boundary(results):
    # Per layer: the QKV input, the reshaped Q, K and V, the 1/sqrt(d) scalar, the causal mask, the
    # softmax output and the projection's input, all swapped; the prediction keeps the prefetch
    # window's layer (and counts the two norms' inputs, which this swap leaves).
    inside, _ = attention_storages()
    assert inside == LAYERS * (4 * B * S * HIDDEN * 2 + B * S * HIDDEN * 2 + 8 + S * S + B * HEADS * S * S * 2)
    saved = results["baseline"]["saved_activation_bytes"] - results["swap"]["saved_activation_bytes"]
    assert saved == inside
    predicted = results["swap"]["predicted_saving_by_technique"]["swap_attention"]
    assert predicted == results["swap"]["predicted_saving_bytes"] == (LAYERS - 1) * B * S * (14 * HIDDEN +
                                                                                            2 * HEADS * S)
    assert results["baseline"]["boundary_bytes"] - results["swap"]["boundary_bytes"] == saved >= predicted
    assert results["swap"]["swapped_activation_bytes"] == saved  # each storage's bytes once per call
    assert results["swap"]["weight_bytes"] == results["baseline"]["weight_bytes"]


@emulated
def test_offload_takes_eight_bytes_of_adamw_state_per_parameter_off_the_boundary(results):
    n = results["baseline"]["parameters"]
    assert results["baseline"]["optimizer_state_bytes"] == results["shared"]["optimizer_state_bytes"] == 8 * n
    off = results["offload"]
    assert off["optimizer_state_bytes"] == 0 and off["offloaded_state_bytes"] == 8 * n
    assert results["shared"]["boundary_bytes"] - off["boundary_bytes"] == 8 * n
    assert off["predicted_saving_by_technique"] == {"shared_storage": 2 * n - n // 8, "optimizer_offload": 8 * n}
    assert results["baseline"]["boundary_bytes"] - off["boundary_bytes"] == off["predicted_saving_bytes"]


@emulated
def test_offload_under_a_budget_keeps_the_parameters_that_fit_in_order(results):
    budget = 300_000
    r = demo.run("offload", steps=2, seq=S, batch=B, layers=LAYERS, ffn=FFN, offload_budget=budget)
    assert r["losses"] == results["baseline"]["losses"][:2]
    _, vocab = gpt.batches(gpt.corpus(), S, B, 1)
    left = budget  # the documented policy: each parameter in order stays if its state fits in what is left
    for p in gpt.GPT(vocab, S, hidden=HIDDEN, layers=LAYERS, ffn=FFN).parameters():
        if 8 * p.numel() <= left:
            left -= 8 * p.numel()
    n = r["parameters"]
    assert r["optimizer_state_bytes"] == budget - left and r["offloaded_state_bytes"] == 8 * n - (budget - left)
    assert r["predicted_saving_by_technique"]["optimizer_offload"] == 8 * n - budget
    assert results["shared"]["boundary_bytes"] - r["boundary_bytes"] == r["offloaded_state_bytes"] >= 8 * n - budget


@emulated
def test_all_the_techniques_add_up(results):
    base, every = results["baseline"], results["all"]
    alone = {c: base["boundary_bytes"] - results[c]["boundary_bytes"] for c in ("shared", "recompute", "swap")}
    alone["offload"] = results["shared"]["boundary_bytes"] - results["offload"]["boundary_bytes"]
    assert base["boundary_bytes"] - every["boundary_bytes"] == sum(alone.values())
    assert every["predicted_saving_by_technique"] == {**results["shared"]["predicted_saving_by_technique"],
                                                      **results["recompute"]["predicted_saving_by_technique"],
                                                      **results["swap"]["predicted_saving_by_technique"],
                                                      **results["offload"]["predicted_saving_by_technique"]}
    assert sum(alone.values()) >= every["predicted_saving_bytes"] == sum(
        every["predicted_saving_by_technique"].values())


def test_the_demo_command_prints_json_with_its_schema(capsys):
    assert demo.main(["--configs", "baseline,all", "--steps", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "stowage.torch.demo/1"
    assert [r["config"] for r in out["results"]] == ["baseline", "all"]
    assert out["results"][1]["same_losses_as_baseline"] is True
    assert out["results"][1]["measured_saving_bytes"] > 0
    assert {"offloaded_state_bytes", "swapped_activation_bytes", "predicted_saving_by_technique"} <= set(
        out["results"][1])
    with pytest.raises(ValueError, match="'zero3' is not one of baseline, shared, recompute, swap, offload, all"):
        demo.run("zero3")
    # The command names a misspelt or empty --configs as a usage error (exit 2), before running anything.
    for bad, said in (("baseline,zero3", "--configs: zero3; choose from baseline, shared"), (",", "none given")):
        with pytest.raises(SystemExit) as exit_:
            demo.main(["--configs", bad])
        assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_apply_refuses_what_it_cannot_do_and_leaves_the_model_as_it_was():
    data, vocab = gpt.batches(gpt.corpus(), 16, 2, 1)
    model = gpt.GPT(vocab, 16)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(UnsupportedError, match="RMSprop has no fused form"):
        apply(model, torch.optim.RMSprop(model.parameters()), recompute=True)
    assert "forward" not in model.blocks[0].mlp.__dict__  # the recompute wrapping was undone
    assert all(p.dtype == torch.float32 and torch.equal(p, q) for p, q in zip(model.parameters(), before))
    with pytest.raises(InvalidArgumentError, match="clip_grad_norm_"):
        apply(model, torch.optim.AdamW(model.parameters()), shared_storage=False, max_grad_norm=1.0)
    with pytest.raises(UnsupportedError, match="amsgrad"):
        apply(model, torch.optim.AdamW(model.parameters(), amsgrad=True))


def test_apply_keeps_param_groups_and_a_resumed_optimizers_state():
    data, vocab = gpt.batches(gpt.corpus(), 16, 2, 3)
    torch.manual_seed(0)
    model = gpt.GPT(vocab, 16)
    rest = [*model.tokens.parameters(), *model.positions.parameters(), *model.norm.parameters()]
    adamw = torch.optim.AdamW([{"params": model.blocks.parameters(), "lr": 1e-2},
                               {"params": model.head.parameters(), "weight_decay": 0.0},
                               {"params": rest}], lr=1e-3, weight_decay=0.1)
    # One plain fp32 step, then the switch: the moments and the step count come along.
    x, y = data[0]
    torch.nn.functional.cross_entropy(model(x).view(-1, vocab), y.view(-1)).backward()
    adamw.step()
    m = adamw.state[model.head.weight]["exp_avg"].clone()
    opt = apply(model, adamw).optimizer
    assert [(g["lr"], g["weight_decay"]) for g in opt.param_groups] == [(1e-2, 0.1), (1e-3, 0.0), (1e-3, 0.1)]
    assert torch.equal(opt.state[model.head.weight]["exp_avg"], m)
    assert float(opt.state[model.head.weight]["step"]) == 1.0
    assert model.head.weight.dtype == torch.bfloat16


def test_apply_with_every_technique_keeps_the_losses():
    data, vocab = gpt.batches(gpt.corpus(), 16, 2, 3)

    def train(techniques):
        torch.manual_seed(0)
        model = gpt.GPT(vocab, 16)
        base = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if techniques:
            done = apply(model, base, recompute=True, recompute_activation_types=(torch.nn.GELU, gpt.SwiGLU),
                         swap=True)
            opt = done.optimizer
            assert done.swap.modules == ["blocks.0.attn", "blocks.1.attn"]
        else:
            opt = demo.MasterWeightsOptimizer(model.parameters(), lr=1e-3)
        losses = []
        for x, y in data:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x).float().view(-1, vocab), y.view(-1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    assert train(True) == train(False)


def test_the_predictions_are_stowage_estimates_own(results, tmp_path):
    # `stowage estimate` on the demo's model: its activation-function recompute term is the
    # recompute prediction the demo holds the measurement to.
    import os
    import subprocess
    import stowage
    tool = os.path.join(os.path.dirname(os.path.realpath(stowage.library_path())), "stowage")
    if not os.path.exists(tool):
        pytest.skip("no stowage command beside the library (an installed package)")
    _, vocab = gpt.batches(gpt.corpus(), S, B, 1)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 64, "intermediate_size": FFN, "num_attention_heads": 4,
                                  "num_hidden_layers": LAYERS, "vocab_size": vocab, "max_position_embeddings": S,
                                  "hidden_act": "gelu"}))
    out = subprocess.run([tool, "estimate", "--model-json", str(config), "--seq", str(S), "--micro-batch", str(B),
                          "--no-flash-attention", "--swap-attention", "--prefetch-window", "1", "--json"],
                         capture_output=True, text=True, check=True).stdout
    est = json.loads(out)
    predicted = est["baseline"]["activations"]["mlp_activation_output"]
    assert predicted == results["recompute"]["predicted_saving_bytes"]
    assert results["baseline"]["saved_activation_bytes"] - results["recompute"]["saved_activation_bytes"] >= predicted
    # Its swap-attention term (the demo's attention is unfused: no flash attention) is the swap
    # prediction.
    attention = [est[k]["activations"]["attention"] + est[k]["activations"]["core_attention"]
                 for k in ("baseline", "per_device")]
    assert attention[0] - attention[1] == results["swap"]["predicted_saving_bytes"]
