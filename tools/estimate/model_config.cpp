#include "tools/estimate/model_config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "stowage/error.hpp"
#include "tools/common/json_input.hpp"

namespace stowage::estimate {

ParameterCounts count_parameters(const ModelConfig& m, std::int64_t vocab) {
  ParameterCounts p;
  const std::int64_t h = m.hidden_size, q = m.num_heads * m.head_size(), kv = m.kv_heads() * m.head_size();
  p.attention = h * q + 2 * h * kv + q * h + (m.linear_bias ? q + 2 * kv + h : 0);
  const std::int64_t fc1_out = m.ffn_hidden_size * (m.gated_mlp ? 2 : 1);
  const std::int64_t mlp = h * fc1_out + m.ffn_hidden_size * h + (m.linear_bias ? fc1_out + h : 0);
  if (m.moe()) {
    p.mlp_dense = h * m.num_experts;  // router
    p.mlp_experts = mlp * m.num_experts;
  } else {
    p.mlp_dense = mlp;
  }
  const std::int64_t norm = m.rms_norm ? h : 2 * h;
  p.norms = 2 * norm + (m.qk_layernorm ? 2 * (m.rms_norm ? 1 : 2) * m.head_size() : 0);
  p.final_norm = norm;
  p.embedding = vocab * h + m.learned_positions * h;
  p.output = m.tie_embeddings ? 0 : vocab * h;
  return p;
}

void validate(const ModelConfig& m) {
  auto positive = [&](std::int64_t v, const char* field) {
    if (v <= 0) throw InvalidArgument(fmt::format("model '{}': {} must be positive, got {}", m.name, field, v));
  };
  positive(m.hidden_size, "hidden_size");
  positive(m.num_layers, "num_layers");
  positive(m.num_heads, "num_attention_heads");
  positive(m.ffn_hidden_size, "ffn_hidden_size");
  positive(m.vocab_size, "vocab_size");
  if (m.num_kv_heads < 0)
    throw InvalidArgument(fmt::format("model '{}': num_key_value_heads must not be negative", m.name));
  if (m.head_dim < 0) throw InvalidArgument(fmt::format("model '{}': head_dim must not be negative", m.name));
  if (m.learned_positions < 0)
    throw InvalidArgument(fmt::format("model '{}': learned position rows must not be negative", m.name));
  if (m.head_dim == 0 && m.hidden_size % m.num_heads != 0)
    throw InvalidArgument(fmt::format("model '{}': num_attention_heads ({}) does not divide hidden_size ({})", m.name,
                                      m.num_heads, m.hidden_size));
  if (m.num_heads % m.kv_heads() != 0)
    throw InvalidArgument(fmt::format("model '{}': num_key_value_heads ({}) does not divide num_attention_heads ({})",
                                      m.name, m.kv_heads(), m.num_heads));
  if (m.num_experts < 0 || m.experts_per_token < 0)
    throw InvalidArgument(fmt::format("model '{}': expert counts must not be negative", m.name));
  if (m.moe() && (m.experts_per_token == 0 || m.experts_per_token > m.num_experts))
    throw InvalidArgument(fmt::format("model '{}': num_experts_per_tok must be in 1..{} , got {}", m.name,
                                      m.num_experts, m.experts_per_token));
  // Products below stay far from int64 overflow with these bounds (hidden² · layers < 2^62).
  constexpr std::int64_t kMaxDim = std::int64_t{1} << 22, kMaxLayers = 1 << 14;
  if (m.hidden_size > kMaxDim || m.ffn_hidden_size > kMaxDim || m.vocab_size > (std::int64_t{1} << 26) ||
      m.num_layers > kMaxLayers || m.num_heads > kMaxDim || m.num_experts > 4096 || m.head_dim > kMaxDim)
    throw InvalidArgument(fmt::format("model '{}': a size is implausibly large", m.name));
}

namespace {

// Published hyper-parameters: Llama 2 paper (Touvron et al. 2023, Table 1) and the released
// config.json files; Llama 3 model card / config.json; GPT-3 paper (Brown et al. 2020, Table 2.1:
// 96 layers, d_model 12288, 96 heads, n_ctx 2048) with the GPT-2 vocabulary of 50257; Mixtral
// 8x7B config.json (Jiang et al. 2024).
ModelConfig llama(std::string name, std::int64_t h, std::int64_t layers, std::int64_t heads, std::int64_t kv,
                  std::int64_t ffn, std::int64_t vocab) {
  ModelConfig m;
  m.name = std::move(name);
  m.hidden_size = h;
  m.num_layers = layers;
  m.num_heads = heads;
  m.num_kv_heads = kv;
  m.ffn_hidden_size = ffn;
  m.vocab_size = vocab;
  return m;
}

std::vector<ModelConfig> presets() {
  std::vector<ModelConfig> all{
      llama("llama2-7b", 4096, 32, 32, 32, 11008, 32000),  llama("llama2-13b", 5120, 40, 40, 40, 13824, 32000),
      llama("llama2-70b", 8192, 80, 64, 8, 28672, 32000),  llama("llama3-8b", 4096, 32, 32, 8, 14336, 128256),
      llama("llama3-70b", 8192, 80, 64, 8, 28672, 128256),
  };
  ModelConfig gpt3 = llama("gpt3-175b", 12288, 96, 96, 96, 4 * 12288, 50257);
  gpt3.tie_embeddings = true;
  gpt3.gated_mlp = false;
  gpt3.rms_norm = false;
  gpt3.linear_bias = true;
  gpt3.dropout = true;
  gpt3.attention_dropout = true;
  gpt3.learned_positions = 2048;
  all.push_back(gpt3);
  ModelConfig mixtral = llama("mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000);
  mixtral.num_experts = 8;
  mixtral.experts_per_token = 2;
  all.push_back(mixtral);
  return all;
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  out.erase(std::remove_if(out.begin(), out.end(), [](char c) { return c == '-' || c == '_' || c == '.'; }), out.end());
  return out;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& m : presets()) names.push_back(m.name);
  return names;
}

ModelConfig preset(std::string_view name) {
  for (const auto& m : presets())
    if (lower(m.name) == lower(name)) return m;
  throw InvalidArgument(fmt::format("unknown model preset '{}' (known: {})", name, fmt::join(preset_names(), ", ")));
}

ModelConfig model_from_hf_json(const std::string& text, const std::string& name) {
  using tools::get_bool_or;
  using tools::get_int;
  using tools::get_int_or;
  using tools::get_string_or;
  const std::string& what = name;
  auto j = tools::parse_json(text, what);
  if (!j.is_object()) throw ParseError(fmt::format("{}: expected a JSON object", what));
  ModelConfig m;
  m.name = get_string_or(j, "_name_or_path", name, what);
  m.hidden_size = get_int(j, "hidden_size", what);
  m.num_layers = get_int(j, "num_hidden_layers", what);
  m.num_heads = get_int(j, "num_attention_heads", what);
  m.num_kv_heads = get_int_or(j, "num_key_value_heads", m.num_heads, what);
  m.ffn_hidden_size = get_int(j, "intermediate_size", what);
  m.vocab_size = get_int(j, "vocab_size", what);
  m.head_dim = get_int_or(j, "head_dim", 0, what);
  m.tie_embeddings = get_bool_or(j, "tie_word_embeddings", false, what);
  m.num_experts = get_int_or(j, "num_local_experts", get_int_or(j, "num_experts", 0, what), what);
  m.experts_per_token = get_int_or(j, "num_experts_per_tok", m.num_experts > 0 ? 2 : 0, what);
  const std::string act = get_string_or(j, "hidden_act", "silu", what);
  m.gated_mlp = act == "silu" || act == "swiglu" || act == "swish";
  m.rms_norm = j.contains("rms_norm_eps") || !j.contains("layer_norm_epsilon");
  m.attention_dropout = tools::get_number_or(j, "attention_dropout", 0.0, what) > 0.0;
  m.dropout = tools::get_number_or(j, "hidden_dropout", 0.0, what) > 0.0;
  m.linear_bias = get_bool_or(j, "attention_bias", false, what) || get_bool_or(j, "mlp_bias", false, what);
  validate(m);
  return m;
}

}  // namespace stowage::estimate
