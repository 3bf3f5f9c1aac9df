#include "tools/estimate/model_config.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <iterator>

#include "stowage/error.hpp"
#include "tools/common/json_input.hpp"

namespace stowage::estimate {

std::int64_t ModelConfig::moe_layers(std::int64_t begin, std::int64_t count) const {
  if (!moe() || count <= 0) return 0;
  if (moe_layer_pattern.empty()) return count;
  std::int64_t n = 0;
  for (std::int64_t i = begin; i < begin + count; ++i) n += moe_layer(i) ? 1 : 0;
  return n;
}

ParameterCounts count_parameters(const ModelConfig& m, std::int64_t vocab) {
  ParameterCounts p;
  p.layers = m.num_layers;
  const std::int64_t h = m.hidden_size, q = m.num_heads * m.head_size(), kv = m.kv_heads() * m.head_size();
  p.attention = h * q + 2 * h * kv + q * h + (m.qkv_bias ? q + 2 * kv : 0) + (m.proj_bias ? h : 0);
  const std::int64_t norm_vectors = m.rms_norm ? 1 : 2;
  std::int64_t attention_norms = m.qk_layernorm ? 2 * norm_vectors * m.head_size() : 0;
  if (m.mla) {
    // Megatron-LM multi_latent_attention.py MLASelfAttention: linear_q_down_proj (h → q_lora_rank)
    // and linear_q_up_proj (→ heads · (qk_head_dim + qk_pos_emb_head_dim)), or linear_q_proj from h
    // without q_lora_rank; linear_kv_down_proj (h → kv_lora_rank + qk_pos_emb_head_dim),
    // linear_kv_up_proj (→ heads · (qk_head_dim + v_head_dim)); linear_proj (heads · v_head_dim → h,
    // the only one with a bias). The same as theoretical_memory_usage.py's self_attn_term (L62-80).
    // The down projections are TELinear 'duplicated' (gpt_layer_specs.py): whole on every TP rank.
    const std::int64_t qr = m.q_lora_rank, kr = m.kv_lora_rank;
    const std::int64_t q_down = qr > 0 ? h * qr : 0, kv_down = h * (kr + m.qk_rope_head_dim);
    const std::int64_t q_up = (qr > 0 ? qr : h) * m.query_width();
    const std::int64_t kv_up = kr * m.num_heads * (m.qk_head_dim + m.v_head_dim);
    p.attention = q_down + q_up + kv_down + kv_up + m.attention_output_width() * h + (m.proj_bias ? h : 0);
    p.attention_replicated = q_down + kv_down;
    // The latents' norms (mla_qk_norm_config.py: fused into the up projections with --qk-layernorm,
    // none without; theoretical_memory_usage.py counts them always, as the released models have them).
    attention_norms = m.qk_layernorm ? norm_vectors * ((qr > 0 ? qr : 0) + kr) : 0;
    if (m.mla_q_input_norm) attention_norms += norm_vectors * h;
  }
  // An MLP of width f: fc1 (2·f outputs when gated), fc2, and their biases.
  auto mlp = [&](std::int64_t f) { return m.mlp_weights(f) + (m.mlp_bias ? f * (m.gated_mlp ? 2 : 1) + h : 0); };
  if (m.moe()) {
    p.mlp_dense = h * m.num_experts + (m.router_expert_bias ? m.num_experts : 0);  // router
    p.mlp_experts = mlp(m.expert_ffn()) * m.num_experts;
    // Shared experts: one MLP of their total width (Megatron shared_experts.py builds an MLP with
    // ffn_hidden_size = moe_shared_expert_intermediate_size, without biases), and the gate's
    // (1, h) weight (theoretical_memory_usage.py shared_expert_params / shared_expert_gate_params).
    if (m.shared_experts()) {
      p.mlp_shared = mlp(m.shared_expert_ffn_hidden_size);
      p.shared_gate = m.shared_expert_gate ? h : 0;
    }
    // A dense layer among them has the dense MLP (gpt_layer_specs.py get_gpt_decoder_layer_specs).
    p.dense_layers = m.num_layers - m.moe_layers(0, m.num_layers);
    p.dense_mlp = p.dense_layers > 0 ? mlp(m.ffn_hidden_size) : 0;
  } else {
    p.mlp_dense = mlp(m.ffn_hidden_size);
  }
  const std::int64_t norm = !m.norm_weights ? 0 : m.rms_norm ? h : 2 * h;
  p.norms = m.norms_per_layer * norm + attention_norms;
  p.final_norm = norm;
  p.embedding = vocab * h + m.learned_positions * h;
  p.output = (m.tie_embeddings ? 0 : vocab * h) + (m.output_bias ? vocab : 0);
  // MTP shares the embedding and the output layer; eh_proj has no bias (multi_token_prediction.py).
  p.mtp_projection = 2 * h * h;
  p.mtp_norms = 3 * norm;
  // A dense model's layer is per_layer(); an MoE model's dense layer per_dense_layer().
  const std::int64_t layer = m.moe() && !m.mtp_moe() ? p.per_dense_layer() : p.per_layer();
  p.mtp = m.mtp_layers * (layer + p.mtp_projection + p.mtp_norms);
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
  if (m.mtp_layers < 0 || m.mtp_layers > 64)
    throw InvalidArgument(
        fmt::format("model '{}': multi-token-prediction layers must be 0..64, got {}", m.name, m.mtp_layers));
  // arguments.py: MTP supports rotary or no position embeddings only.
  if (m.mtp_layers > 0 && m.learned_positions > 0)
    throw InvalidArgument(fmt::format(
        "model '{}': multi-token prediction with learned position embeddings (Megatron-LM supports rope and none only)",
        m.name));
  if (m.head_dim == 0 && m.hidden_size % m.num_heads != 0)
    throw InvalidArgument(fmt::format("model '{}': num_attention_heads ({}) does not divide hidden_size ({})", m.name,
                                      m.num_heads, m.hidden_size));
  if (m.num_heads % m.kv_heads() != 0)
    throw InvalidArgument(fmt::format("model '{}': num_key_value_heads ({}) does not divide num_attention_heads ({})",
                                      m.name, m.kv_heads(), m.num_heads));
  if (m.mla) {
    if (m.kv_lora_rank <= 0 || m.qk_head_dim <= 0 || m.v_head_dim <= 0)
      throw InvalidArgument(fmt::format(
          "model '{}': multi-latent attention needs positive kv_lora_rank, qk_head_dim and v_head_dim", m.name));
    if (m.q_lora_rank < 0 || m.qk_rope_head_dim < 0)
      throw InvalidArgument(fmt::format("model '{}': q_lora_rank and qk_rope_head_dim must not be negative", m.name));
    if (m.kv_heads() != m.num_heads)  // arguments.py: MLA excludes grouped-query attention
      throw InvalidArgument(fmt::format("model '{}': multi-latent attention has no grouped-query attention", m.name));
    if (std::max({m.q_lora_rank, m.kv_lora_rank, m.qk_head_dim, m.qk_rope_head_dim, m.v_head_dim}) > (1 << 16))
      throw InvalidArgument(fmt::format("model '{}': a size is implausibly large", m.name));
  }
  if (m.num_experts < 0 || m.experts_per_token < 0 || m.moe_ffn_hidden_size < 0 || m.shared_expert_ffn_hidden_size < 0)
    throw InvalidArgument(fmt::format("model '{}': expert counts must not be negative", m.name));
  if (m.shared_expert_ffn_hidden_size > 0 && !m.moe())
    throw InvalidArgument(fmt::format("model '{}': shared experts need routed experts (num_experts)", m.name));
  // Megatron-LM's SharedExpertMLP asserts add_bias_linear == False (shared_experts.py).
  if (m.shared_experts() && m.mlp_bias)
    throw InvalidArgument(
        fmt::format("model '{}': shared experts without MLP biases only (Megatron-LM's SharedExpertMLP asserts "
                    "--disable-bias-linear)",
                    m.name));
  if (!m.moe_layer_pattern.empty() && std::ssize(m.moe_layer_pattern) != m.num_layers)
    throw InvalidArgument(fmt::format("model '{}': the MoE layer pattern has {} entries for {} layers", m.name,
                                      m.moe_layer_pattern.size(), m.num_layers));
  if (std::any_of(m.moe_layer_pattern.begin(), m.moe_layer_pattern.end(), [](std::uint8_t v) { return v > 1; }))
    throw InvalidArgument(fmt::format("model '{}': the MoE layer pattern takes 0 (dense) and 1 (MoE) only", m.name));
  if (m.moe() && (m.experts_per_token == 0 || m.experts_per_token > m.num_experts))
    throw InvalidArgument(fmt::format("model '{}': num_experts_per_tok must be in 1..{} , got {}", m.name,
                                      m.num_experts, m.experts_per_token));
  // Products below stay far from int64 overflow with these bounds (hidden² · layers < 2^62).
  constexpr std::int64_t kMaxDim = std::int64_t{1} << 22, kMaxLayers = 1 << 14;
  if (m.hidden_size > kMaxDim || m.ffn_hidden_size > kMaxDim || m.moe_ffn_hidden_size > kMaxDim ||
      m.shared_expert_ffn_hidden_size > kMaxDim || m.vocab_size > (std::int64_t{1} << 26) ||
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
  gpt3.set_linear_bias(true);
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

namespace {

// What a Hugging Face model_type says that its config.json does not (transformers'
// modeling_*.py, and the released checkpoints' parameter counts, checked in the tests).
struct Family {
  const char* type;
  bool tied_by_default;          // its config class's tie_word_embeddings default
  bool gated;                    // SwiGLU, or GeGLU for Gemma whatever hidden_act says
  bool layer_norm;               // LayerNorm (weight and bias) instead of RMSNorm
  bool weightless_norm;          // OLMo: LayerNorm without parameters
  std::int64_t norms_per_layer;  // Phi: one, shared by attention and MLP; Gemma 2: four
  bool qkv_bias;                 // Qwen2: q, k and v carry biases with no key saying so
  bool linear_bias;              // every linear layer has a bias (GPT-2, GPT-NeoX, Phi)
  bool output_bias;              // the output projection has a bias (Phi)
  bool qk_norm;                  // Qwen3: RMSNorm on each head's queries and keys
  bool shared_gate;              // Qwen2-MoE: shared_expert_gate, a Linear(h, 1) (modeling_qwen2_moe.py)
};
constexpr Family kFamilies[] = {
    // type      tied   gated  LN     no-w   norms  qkv-b  bias   out-b  qk-norm shared-gate
    {"llama", false, true, false, false, 2, false, false, false, false, false},
    {"mistral", false, true, false, false, 2, false, false, false, false, false},
    {"mixtral", false, true, false, false, 2, false, false, false, false, false},
    {"qwen2", false, true, false, false, 2, true, false, false, false, false},
    {"qwen2_moe", false, true, false, false, 2, true, false, false, false, true},
    // DeepSeek-MoE (modeling_deepseek.py): Llama's layer, MoE layers of routed and shared experts.
    {"deepseek", false, true, false, false, 2, false, false, false, false, false},
    // DeepSeek-V2/V3 and Kimi K2 (modeling_deepseek_v2.py, modeling_deepseek_v3.py): DeepSeek-MoE's
    // layer with multi-latent attention (read_mla).
    {"deepseek_v2", false, true, false, false, 2, false, false, false, false, false},
    {"deepseek_v3", false, true, false, false, 2, false, false, false, false, false},
    {"kimi_k2", false, true, false, false, 2, false, false, false, false, false},
    {"qwen3", false, true, false, false, 2, false, false, false, true, false},
    {"gemma", true, true, false, false, 2, false, false, false, false, false},
    {"gemma2", true, true, false, false, 4, false, false, false, false, false},
    {"olmo", false, true, true, true, 2, false, false, false, false, false},
    {"gpt2", true, false, true, false, 2, false, true, false, false, false},
    {"gpt_neox", false, false, true, false, 2, false, true, false, false, false},
    {"phi", false, false, true, false, 1, false, true, true, false, false},
};

// Which layers are MoE. DeepSeek (modeling_deepseek.py DeepseekDecoderLayer, and V2/V3/Kimi alike):
// layer i when i >= first_k_dense_replace and i % moe_layer_freq == 0. Qwen2-MoE
// (modeling_qwen2_moe.py Qwen2MoeDecoderLayer): layer i when i is not in mlp_only_layers and
// (i + 1) % decoder_sparse_step == 0. The others are a dense MLP of intermediate_size.
void read_moe_layers(const nlohmann::json& j, const std::string& what, ModelConfig& m) {
  using tools::get_int_or;
  if (!m.moe()) return;
  auto positive = [&](const char* key) {
    const std::int64_t v = get_int_or(j, key, 1, what);
    if (v <= 0) throw ParseError(fmt::format("{}: field '{}' must be positive, got {}", what, key, v));
    return v;
  };
  const std::int64_t first_dense = get_int_or(j, "first_k_dense_replace", 0, what);
  if (first_dense < 0) throw ParseError(fmt::format("{}: field 'first_k_dense_replace' must not be negative", what));
  const std::int64_t freq = positive("moe_layer_freq"), step = positive("decoder_sparse_step");
  std::vector<std::int64_t> mlp_only;
  if (j.contains("mlp_only_layers") && !j.at("mlp_only_layers").is_null()) {
    if (!j.at("mlp_only_layers").is_array())
      throw ParseError(fmt::format("{}: field 'mlp_only_layers' must be a list of layer indices", what));
    for (const auto& v : j.at("mlp_only_layers")) {
      if (!v.is_number_integer())
        throw ParseError(fmt::format("{}: field 'mlp_only_layers' must be a list of layer indices", what));
      mlp_only.push_back(v.get<std::int64_t>());
    }
  }
  if (m.num_layers <= 0 || m.num_layers > (1 << 14)) return;  // validate() names the layer count
  std::vector<std::uint8_t> pattern(static_cast<std::size_t>(m.num_layers));
  bool mixed = false;
  for (std::int64_t i = 0; i < m.num_layers; ++i) {
    const bool listed = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end();
    const bool moe = i >= first_dense && i % freq == 0 && (i + 1) % step == 0 && !listed;
    pattern[static_cast<std::size_t>(i)] = moe ? 1 : 0;
    mixed = mixed || !moe;
  }
  if (mixed) m.moe_layer_pattern = std::move(pattern);
}

// Routed experts of their own width and shared experts (Qwen2-MoE: shared_expert_intermediate_size;
// DeepSeek-MoE: n_shared_experts experts of moe_intermediate_size, n_routed_experts routed).
void read_moe_widths(const nlohmann::json& j, const std::string& what, ModelConfig& m) {
  using tools::get_int_or;
  if (j.contains("n_routed_experts")) m.num_experts = tools::get_int(j, "n_routed_experts", what);
  m.moe_ffn_hidden_size = get_int_or(j, "moe_intermediate_size", 0, what);
  m.shared_expert_ffn_hidden_size = get_int_or(j, "shared_expert_intermediate_size", 0, what);
  const std::int64_t n_shared = get_int_or(j, "n_shared_experts", 0, what);
  if (n_shared > 0 && m.moe_ffn_hidden_size <= 0)
    throw ParseError(
        fmt::format("{}: 'n_shared_experts' needs 'moe_intermediate_size' (each shared expert's width)", what));
  // DeepseekMoE builds its shared experts as one MLP of n_shared_experts × moe_intermediate_size.
  if (n_shared > 0) m.shared_expert_ffn_hidden_size += n_shared * m.moe_ffn_hidden_size;
  if (m.moe_ffn_hidden_size < 0 || m.shared_expert_ffn_hidden_size < 0 || n_shared < 0)
    throw ParseError(fmt::format("{}: expert widths must not be negative", what));
}

// Multi-latent attention (transformers modeling_deepseek_v2.py / modeling_deepseek_v3.py
// DeepseekV2Attention): q_proj (h → heads · (qk_nope_head_dim + qk_rope_head_dim)) when q_lora_rank
// is null, else q_a_proj (h → q_lora_rank), q_a_layernorm and q_b_proj; kv_a_proj_with_mqa
// (h → kv_lora_rank + qk_rope_head_dim), kv_a_layernorm, kv_b_proj (→ heads · (qk_nope_head_dim +
// v_head_dim)); o_proj (heads · v_head_dim → h). Both latent norms are RMSNorms with weights.
void read_mla(const nlohmann::json& j, const std::string& what, ModelConfig& m, std::vector<std::string>* warnings) {
  using tools::get_int_or;
  if (!j.contains("kv_lora_rank") || j.at("kv_lora_rank").is_null()) {
    for (const char* key : {"q_lora_rank", "qk_nope_head_dim", "v_head_dim"})
      if (j.contains(key) && !j.at(key).is_null())
        throw ParseError(fmt::format("{}: '{}' without 'kv_lora_rank': multi-latent attention needs both", what, key));
    return;
  }
  m.mla = true;
  m.kv_lora_rank = tools::get_int(j, "kv_lora_rank", what);
  m.q_lora_rank = get_int_or(j, "q_lora_rank", 0, what);
  m.qk_head_dim = tools::get_int(j, "qk_nope_head_dim", what);
  m.qk_rope_head_dim = tools::get_int(j, "qk_rope_head_dim", what);
  m.v_head_dim = tools::get_int(j, "v_head_dim", what);
  m.qk_layernorm = true;
  // DeepseekV3TopkRouter's e_score_correction_bias, used by the noaux_tc routing.
  m.router_expert_bias = m.moe() && tools::get_string_or(j, "topk_method", "", what) == "noaux_tc";
  if (tools::get_bool_or(j, "attention_bias", false, what))
    throw ParseError(fmt::format("{}: 'attention_bias' with multi-latent attention is not modelled", what));
  // DeepSeek sparse attention adds an indexer (its own projections and per-head scores).
  if (j.contains("index_n_heads"))
    throw ParseError(fmt::format(
        "{}: 'index_n_heads': sparse attention's indexer beside multi-latent attention is not modelled", what));
  // DeepSeek-V3's multi-token-prediction module (layer num_hidden_layers on) is in its checkpoint
  // but not in transformers' model, nor in this count.
  const std::int64_t mtp = get_int_or(j, "num_nextn_predict_layers", 0, what);
  if (mtp > 0 && warnings != nullptr)
    warnings->push_back(fmt::format(
        "{}: num_nextn_predict_layers {}: {} (transformers does not build them); to train them give --mtp-layers "
        "(Megatron-LM: --mtp-num-layers)",
        what, mtp, kMtpNotCounted));
}

}  // namespace

ModelConfig model_from_hf_json(const std::string& text, const std::string& name, std::vector<std::string>* warnings) {
  using tools::get_bool_or;
  using tools::get_int;
  using tools::get_int_or;
  using tools::get_string_or;
  const std::string& what = name;
  auto j = tools::parse_json(text, what);
  if (!j.is_object()) throw ParseError(fmt::format("{}: expected a JSON object", what));
  ModelConfig m;
  m.name = get_string_or(j, "_name_or_path", name, what);
  // GPT-2's config names its sizes n_embd, n_layer, n_head, n_inner (null: 4h), n_positions.
  const bool gpt2_keys = j.contains("n_embd");
  m.hidden_size = get_int(j, gpt2_keys ? "n_embd" : "hidden_size", what);
  m.num_layers = get_int(j, gpt2_keys ? "n_layer" : "num_hidden_layers", what);
  m.num_heads = get_int(j, gpt2_keys ? "n_head" : "num_attention_heads", what);
  m.num_kv_heads = get_int_or(j, "num_key_value_heads", m.num_heads, what);
  if (j.contains("num_key_value_heads") && !j.at("num_key_value_heads").is_null() &&
      m.num_kv_heads == 0)  // 0 would read as "as many as the query heads"
    throw ParseError(fmt::format("{}: field 'num_key_value_heads' must be positive, got 0", what));
  m.ffn_hidden_size =
      gpt2_keys ? get_int_or(j, "n_inner", 4 * m.hidden_size, what) : get_int(j, "intermediate_size", what);
  if (gpt2_keys) m.learned_positions = get_int(j, "n_positions", what);
  m.vocab_size = get_int(j, "vocab_size", what);
  m.head_dim = get_int_or(j, "head_dim", 0, what);
  const std::string type = get_string_or(j, "model_type", "", what);
  const Family* family = nullptr;
  for (const Family& f : kFamilies)
    if (type == f.type) family = &f;
  m.tie_embeddings = get_bool_or(j, "tie_word_embeddings", family != nullptr && family->tied_by_default, what);
  m.num_experts = get_int_or(j, "num_local_experts", get_int_or(j, "num_experts", 0, what), what);
  read_moe_widths(j, what, m);
  read_mla(j, what, m, warnings);
  read_moe_layers(j, what, m);
  m.experts_per_token = get_int_or(j, "num_experts_per_tok", m.num_experts > 0 ? 2 : 0, what);
  const std::string act = get_string_or(j, "hidden_act", "silu", what);
  // GPT-2 and GPT-J name their dropouts attn_pdrop / resid_pdrop, Phi attention_dropout /
  // resid_pdrop (transformers' modeling_gpt2.py, modeling_phi.py: the residual dropout follows
  // the attention and the MLP, as hidden_dropout does elsewhere).
  auto rate = [&](const char* key, const char* other) {
    return std::max(tools::get_number_or(j, key, 0.0, what), tools::get_number_or(j, other, 0.0, what));
  };
  m.attention_dropout = rate("attention_dropout", "attn_pdrop") > 0.0;
  m.dropout = rate("hidden_dropout", "resid_pdrop") > 0.0;
  const bool attention_bias = get_bool_or(j, "attention_bias", false, what);
  m.qkv_bias = attention_bias;  // transformers' attention_bias: q, k, v and the output projection
  m.proj_bias = attention_bias;
  m.mlp_bias = get_bool_or(j, "mlp_bias", false, what);
  if (family != nullptr) {
    m.gated_mlp = family->gated;
    m.rms_norm = !family->layer_norm;
    m.norm_weights = !family->weightless_norm;
    m.norms_per_layer = family->norms_per_layer;
    if (family->linear_bias) m.set_linear_bias(true);
    m.qkv_bias = m.qkv_bias || family->qkv_bias;
    m.output_bias = family->output_bias;
    m.qk_layernorm = family->qk_norm || m.mla;
    m.shared_expert_gate = family->shared_gate && m.shared_expert_ffn_hidden_size > 0;
    // Later Qwen2MoeConfig names the q, k and v biases (qkv_bias, true by default).
    if (type == "qwen2_moe") m.qkv_bias = get_bool_or(j, "qkv_bias", true, what);
  } else {
    m.gated_mlp = act == "silu" || act == "swiglu" || act == "swish";
    m.rms_norm = j.contains("rms_norm_eps") || !(j.contains("layer_norm_epsilon") || j.contains("layer_norm_eps"));
    if (warnings != nullptr)
      warnings->push_back(fmt::format(
          "{}: model_type '{}' is not one the estimate knows ({}): read as a decoder with {} MLP, {}, {} "
          "embeddings and biases only where attention_bias / mlp_bias say; its parameter count is not "
          "checked against its architecture",
          what, type,
          [] {
            std::string known;
            for (const Family& f : kFamilies) known += std::string(known.empty() ? "" : ", ") + f.type;
            return known;
          }(),
          m.gated_mlp ? "a gated" : "a plain", m.rms_norm ? "RMSNorm" : "LayerNorm",
          m.tie_embeddings ? "tied" : "untied"));
  }
  validate(m);
  return m;
}

}  // namespace stowage::estimate
