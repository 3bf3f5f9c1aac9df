"""The small GPT trained with every configuration of stowage.torch.apply(): the same losses bit
for bit as plain PyTorch, and each technique lowers the bytes live at the forward/backward
boundary by what it was predicted to (measured on the CPU tensors themselves)."""
import json

import pytest

torch = pytest.importorskip("torch")

from stowage import InvalidArgumentError, UnsupportedError  # noqa: E402
from stowage.torch import demo, gpt  # noqa: E402
from stowage.torch.adaptor import apply  # noqa: E402

B, S, FFN, LAYERS = 4, 32, 256, 2


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
    both = results["baseline"]["boundary_bytes"] - results["all"]["boundary_bytes"]
    assert both == saved + (results["baseline"]["weight_bytes"] - results["shared"]["weight_bytes"])


def test_the_demo_command_prints_json_with_its_schema(capsys):
    assert demo.main(["--configs", "baseline,all", "--steps", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "stowage.torch.demo/1"
    assert [r["config"] for r in out["results"]] == ["baseline", "all"]
    assert out["results"][1]["same_losses_as_baseline"] is True
    assert out["results"][1]["measured_saving_bytes"] > 0
    with pytest.raises(ValueError, match="not one of"):
        demo.run("swap")


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
    adamw = torch.optim.AdamW([{"params": model.blocks.parameters(), "lr": 1e-2},
                               {"params": model.head.parameters(), "weight_decay": 0.0}], lr=1e-3, weight_decay=0.1)
    # One plain fp32 step, then the switch: the moments and the step count come along.
    x, y = data[0]
    torch.nn.functional.cross_entropy(model(x).view(-1, vocab), y.view(-1)).backward()
    adamw.step()
    m = adamw.state[model.head.weight]["exp_avg"].clone()
    opt = apply(model, adamw).optimizer
    assert [(g["lr"], g["weight_decay"]) for g in opt.param_groups] == [(1e-2, 0.1), (1e-3, 0.0)]
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
                          "--json"], capture_output=True, text=True, check=True).stdout
    predicted = json.loads(out)["baseline"]["activations"]["mlp_activation_output"]
    assert predicted == results["recompute"]["predicted_saving_bytes"]
    assert results["baseline"]["saved_activation_bytes"] - results["recompute"]["saved_activation_bytes"] >= predicted
