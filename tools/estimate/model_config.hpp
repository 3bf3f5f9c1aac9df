#pragma once
// The shape of a transformer, as the memory estimate needs it: presets with published
// hyper-parameters, or the fields of a Hugging Face config.json.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace stowage::estimate {

struct ModelConfig {
  std::string name;
  std::int64_t hidden_size = 0;
  std::int64_t num_layers = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;  // == num_heads without grouped-query attention
  std::int64_t head_dim = 0;      // 0: hidden_size / num_heads
  std::int64_t ffn_hidden_size = 0;
  std::int64_t vocab_size = 0;
  bool tie_embeddings = false;
  bool gated_mlp = true;               // SwiGLU: fc1 has 2·ffn outputs
  bool rms_norm = true;                // RMSNorm (1 vector) or LayerNorm (weight + bias)
  bool linear_bias = false;            // biases in the linear layers (GPT-3)
  bool dropout = false;                // hidden dropout after attention and MLP (stores 1-byte masks)
  bool attention_dropout = false;      // dropout on the attention probabilities (unfused: a 1-byte s×s mask)
  bool qk_layernorm = false;           // norms on queries and keys (Megatron --qk-layernorm)
  std::int64_t learned_positions = 0;  // rows of a learned position embedding (0: RoPE)
  // Mixture of experts: 0 experts = dense MLP.
  std::int64_t num_experts = 0;
  std::int64_t experts_per_token = 0;

  std::int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  std::int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_heads; }
  bool moe() const { return num_experts > 0; }
};

// Parameter counts, split the way parallelism splits them.
struct ParameterCounts {
  std::int64_t attention = 0;    // per layer: q, k, v, o (+ biases)
  std::int64_t mlp_dense = 0;    // per layer: the MLP of a dense model, or the router of an MoE
  std::int64_t mlp_experts = 0;  // per layer: all experts together (0 for dense)
  std::int64_t norms = 0;        // per layer: the two norms
  std::int64_t embedding = 0;    // vocab × hidden (+ learned positions)
  std::int64_t output = 0;       // untied output projection (0 when tied)
  std::int64_t final_norm = 0;
  std::int64_t per_layer() const { return attention + mlp_dense + mlp_experts + norms; }
  std::int64_t total(std::int64_t layers) const { return per_layer() * layers + embedding + output + final_norm; }
};

ParameterCounts count_parameters(const ModelConfig& m, std::int64_t vocab);

// InvalidArgument naming the field for zero or negative sizes and inconsistent heads.
void validate(const ModelConfig& m);

std::vector<std::string> preset_names();
// InvalidArgument listing the known names when `name` is not one (case-insensitive).
ModelConfig preset(std::string_view name);

// Reads the fields of a Hugging Face config.json (hidden_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, tie_word_embeddings,
// num_local_experts, num_experts_per_tok, hidden_act, head_dim). ParseError naming the field.
ModelConfig model_from_hf_json(const std::string& text, const std::string& name = "config.json");

}  // namespace stowage::estimate
