// The estimate's Hugging Face config.json input: each family's architecture, the MoE layouts
// (shared experts, dense first layers), released checkpoints' exact parameter counts, and the
// fields a config must get right. Megatron-LM arguments: tools_estimate_megatron_test.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "stowage/error.hpp"
#include "tools/estimate/layer_activations.hpp"
#include "tools/estimate/megatron_args.hpp"
#include "tools/estimate/model_config.hpp"

#include <nlohmann/json.hpp>
#include "tools_estimate_test_util.hpp"

using namespace stowage;
using namespace stowage::estimate;
using namespace stowage::testing;

// Published parameter counts of the released checkpoints (sum of tensor sizes in the
// Hugging Face safetensors indexes).
TEST(EstimateInput, HuggingFaceConfigWithMoeFields) {
  const std::string mixtral = R"({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "tie_word_embeddings": false,
    "num_local_experts": 8, "num_experts_per_tok": 2, "hidden_act": "silu", "rms_norm_eps": 1e-5})";
  const ModelConfig m = model_from_hf_json(mixtral, "mixtral.json");
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.experts_per_token, 2);
  EXPECT_EQ(total_params(m), total_params(preset("mixtral-8x7b")));
}

namespace {

nlohmann::json hf_configs() {
  std::ifstream in(std::string(STOWAGE_SOURCE_DIR) + "/tests/data/hf_configs.json");
  return nlohmann::json::parse(in);
}

// Released checkpoints' config.json files: each family's architecture (the biases, norms and
// tying its config does not spell out) gives the checkpoint's exact parameter count, with no warning.
TEST(EstimateInput, HuggingFaceConfigsCountTheirCheckpointsParametersExactly) {
  const nlohmann::json all = hf_configs();
  ASSERT_GE(all.at("counted").size(), 18u);
  for (const auto& c : all.at("counted")) {
    const std::string name = c.at("name").get<std::string>();
    std::vector<std::string> warnings;
    const ModelConfig m = model_from_hf_json(c.at("config").dump(), name, &warnings);
    EXPECT_EQ(count_parameters(m, m.vocab_size).total(), c.at("parameters").get<std::int64_t>()) << name;
    EXPECT_TRUE(warnings.empty()) << name << ": " << (warnings.empty() ? "" : warnings[0]);
  }
}

// DeepSeek-MoE 16B (modeling_deepseek.py DeepseekDecoderLayer): layer i is MoE when i >=
// first_k_dense_replace and i % moe_layer_freq == 0, else a dense MLP of intermediate_size. Its
// first layer is dense: 16375728128 parameters, the released checkpoint's (hf_configs.json).
TEST(EstimateInput, DeepSeekMoeDenseFirstLayerIsCounted) {
  const nlohmann::json all = hf_configs();
  bool found = false;
  for (const auto& c : all.at("counted")) {
    if (c.at("name") != "deepseek-moe-16b") continue;
    found = true;
    const ModelConfig m = model_from_hf_json(c.at("config").dump(), "deepseek-moe-16b");
    ASSERT_EQ(m.moe_layer_pattern.size(), 28u);
    EXPECT_EQ(m.moe_layer_pattern[0], 0);
    EXPECT_EQ(m.moe_layers(0, 28), 27);
    EXPECT_TRUE(m.mixed_layers());
    const ParameterCounts p = count_parameters(m, m.vocab_size);
    const std::int64_t h = 2048;
    EXPECT_EQ(p.dense_layers, 1);
    EXPECT_EQ(p.dense_mlp, 3 * h * 10944);
    EXPECT_EQ(p.mlp_experts, 64 * 3 * h * 1408);
    EXPECT_EQ(p.mlp_shared, 3 * h * 2 * 1408);
    // One dense layer, 27 MoE layers, untied embedding and output, the final norm.
    const std::int64_t attention = 4 * h * h, norms = 2 * h;
    EXPECT_EQ(p.total(), (attention + 3 * h * 10944 + norms) +
                             27 * (attention + 64 * h + 64 * 3 * h * 1408 + 3 * h * 2816 + norms) + 2 * 102400 * h + h);
  }
  EXPECT_TRUE(found);
}

// Qwen2-MoE (transformers modeling_qwen2_moe.py): each MoE layer has routed experts of
// moe_intermediate_size, one shared expert MLP of shared_expert_intermediate_size and its
// Linear(h, 1) gate, without biases; q, k and v keep theirs.
TEST(EstimateInput, Qwen2MoeSharedExpertAndGateAreCounted) {
  const nlohmann::json all = hf_configs();
  for (const auto& c : all.at("counted")) {
    if (c.at("name") != "qwen1.5-moe-a2.7b") continue;
    const ModelConfig m = model_from_hf_json(c.at("config").dump(), "qwen1.5-moe-a2.7b");
    EXPECT_EQ(m.num_experts, 60);
    EXPECT_EQ(m.experts_per_token, 4);
    EXPECT_EQ(m.expert_ffn(), 1408);
    EXPECT_EQ(m.shared_expert_ffn_hidden_size, 5632);
    EXPECT_TRUE(m.shared_expert_gate);
    const ParameterCounts p = count_parameters(m, m.vocab_size);
    const std::int64_t h = 2048;
    EXPECT_EQ(p.mlp_shared, 3 * h * 5632);
    EXPECT_EQ(p.shared_gate, h);
    EXPECT_EQ(p.mlp_experts, 60 * 3 * h * 1408);
    EXPECT_EQ(p.mlp_dense, 60 * h);  // the router
    EXPECT_EQ(p.attention, 4 * h * h + 3 * h);
  }
  // Qwen2MoeDecoderLayer: layer i is MoE when it is not in mlp_only_layers and (i + 1) %
  // decoder_sparse_step == 0; the others are a dense MLP of intermediate_size.
  const std::string base = R"({"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 4,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "num_experts": 4,
      "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64)";
  const ModelConfig all_moe = model_from_hf_json(base + R"(, "decoder_sparse_step": 1, "mlp_only_layers": []})");
  EXPECT_TRUE(all_moe.moe_layer_pattern.empty());
  const ModelConfig every_second = model_from_hf_json(base + R"(, "decoder_sparse_step": 2})");
  EXPECT_EQ(every_second.moe_layer_pattern, (std::vector<std::uint8_t>{0, 1, 0, 1}));
  const ModelConfig listed = model_from_hf_json(base + R"(, "mlp_only_layers": [0, 3]})");
  EXPECT_EQ(listed.moe_layer_pattern, (std::vector<std::uint8_t>{0, 1, 1, 0}));
  // A dense layer: q, k, v (with biases) and o, a SwiGLU MLP of 128, two RMSNorms; an MoE layer adds
  // the router, 4 experts of 32, the shared expert of 64 and its gate instead of that MLP.
  const std::int64_t h = 64, attention = 4 * h * h + 3 * h, norms = 2 * h;
  const std::int64_t dense = attention + 3 * h * 128 + norms;
  const std::int64_t moe = attention + 4 * h + 4 * 3 * h * 32 + 3 * h * 64 + h + norms;
  EXPECT_EQ(count_parameters(every_second, 100).total(), 2 * dense + 2 * moe + 2 * 100 * h + h);
  EXPECT_EQ(count_parameters(all_moe, 100).total(), 4 * moe + 2 * 100 * h + h);
  EXPECT_THROW((void)model_from_hf_json(base + R"(, "decoder_sparse_step": 0})"), ParseError);
  EXPECT_THROW((void)model_from_hf_json(base + R"(, "mlp_only_layers": [0.5]})"), ParseError);
}

// DeepSeek-MoE's layout (n_routed_experts, n_shared_experts × moe_intermediate_size in one MLP,
// no gate) when every layer is MoE; MLA (kv_lora_rank, DeepSeek-V2/V3) is refused.
TEST(EstimateInput, DeepSeekSharedExpertsAreOneMlpOfTheirTotalWidth) {
  const std::string base = R"({"model_type": "deepseek", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "n_routed_experts": 8,
      "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_shared_experts": 2, "first_k_dense_replace": 0,
      "rms_norm_eps": 1e-6)";
  std::vector<std::string> warnings;
  const ModelConfig m = model_from_hf_json(base + R"(, "moe_layer_freq": 1})", "deepseek.json", &warnings);
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.shared_expert_ffn_hidden_size, 32);
  EXPECT_FALSE(m.shared_expert_gate);
  const std::int64_t h = 64;
  // Per layer: attention 4h², router 8h, 8 experts of 3·h·16, shared 3·h·32, two RMSNorms.
  const std::int64_t layer = 4 * h * h + 8 * h + 8 * 3 * h * 16 + 3 * h * 32 + 2 * h;
  EXPECT_EQ(count_parameters(m, 100).total(), 2 * layer + 2 * 100 * h + h);
  EXPECT_THROW((void)model_from_hf_json(base + R"(, "kv_lora_rank": 512})"), ParseError);
  EXPECT_TRUE(warnings.empty());
  // first_k_dense_replace 1 and moe_layer_freq 2: layer 0 is below it, layers 1 and 3 are odd.
  const std::string four = R"({"model_type": "deepseek", "hidden_size": 64, "num_hidden_layers": 4,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "n_routed_experts": 8,
      "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_shared_experts": 2, "rms_norm_eps": 1e-6)";
  EXPECT_EQ(model_from_hf_json(four + R"(, "first_k_dense_replace": 1, "moe_layer_freq": 2})").moe_layer_pattern,
            (std::vector<std::uint8_t>{0, 0, 1, 0}));
  EXPECT_EQ(model_from_hf_json(four + R"(, "first_k_dense_replace": 3})").moe_layer_pattern,
            (std::vector<std::uint8_t>{0, 0, 0, 1}));
  EXPECT_THROW((void)model_from_hf_json(four + R"(, "first_k_dense_replace": -1})"), ParseError);
}

TEST(EstimateInput, ZeroKeyValueHeadsAreRefusedNotReadAsMultiHead) {
  EXPECT_THROW((void)model_from_hf_json(
                   R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 0, "intermediate_size": 128, "vocab_size": 100})"),
               ParseError);
}

TEST(EstimateInput, AnUnknownModelTypeIsReadWithAWarningThatSaysHow) {
  std::vector<std::string> warnings;
  const ModelConfig m = model_from_hf_json(
      R"({"model_type": "newarch", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 128, "vocab_size": 100, "hidden_act": "gelu", "layer_norm_eps": 1e-5})",
      "new.json", &warnings);
  EXPECT_FALSE(m.gated_mlp);
  EXPECT_FALSE(m.rms_norm);  // layer_norm_eps, as GPT-NeoX and Phi spell it
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("model_type 'newarch' is not one the estimate knows"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("a plain MLP, LayerNorm, untied embeddings"), std::string::npos) << warnings[0];
}

}  // namespace

// GPT-2's config names its dropouts attn_pdrop and resid_pdrop (transformers' modeling_gpt2.py),
// Phi's attention_dropout and resid_pdrop: read, a GPT-2 layer without flash attention keeps
// Korthikanti's sbh(34 + 5as/h) (12 heads, h 768, ffn 4h, GeLU, LayerNorm, biases).
TEST(EstimateInput, Gpt2AndPhiDropoutNamesAreRead) {
  const nlohmann::json all = hf_configs();  // kept: the loop reads into it
  for (const auto& c : all.at("counted")) {
    const std::string name = c.at("name").get<std::string>();
    if (name != "gpt2" && name != "phi-2") continue;
    const ModelConfig m = model_from_hf_json(c.at("config").dump(), name);
    EXPECT_EQ(m.attention_dropout, name == "gpt2") << name;  // phi-2: attention_dropout 0.0
    EXPECT_TRUE(m.dropout) << name;                          // resid_pdrop 0.1 in both
    if (name != "gpt2") continue;
    RunConfig r;
    r.model = m;
    r.training.seq_length = 1024;
    r.training.flash_attention = false;
    const double s = 1024, h = 768, a = 12;
    EXPECT_NEAR(layer_bytes_per_token(r, false).total() * s, s * h * (34 + 5 * a * s / h), 1.0);
    std::string zeroed = c.at("config").dump();
    for (const char* key : {"\"attn_pdrop\":0.1", "\"resid_pdrop\":0.1"})
      zeroed.replace(zeroed.find(key), std::string(key).size(),
                     std::string(key).substr(0, std::string(key).size() - 3) + "0.0");
    const ModelConfig none = model_from_hf_json(zeroed, name);
    EXPECT_FALSE(none.attention_dropout || none.dropout);
  }
}
