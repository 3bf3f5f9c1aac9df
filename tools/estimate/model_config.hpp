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
  bool norm_weights = true;            // false: norms without parameters (OLMo's LayerNorm)
  std::int64_t norms_per_layer = 2;    // before attention and MLP; Gemma 2 also after each: 4
  bool qkv_bias = false;               // biases on q, k and v (GPT-3, Megatron's default, Qwen2)
  bool proj_bias = false;              // a bias on the attention's output projection
  bool mlp_bias = false;               // biases on the MLP's two linear layers
  bool output_bias = false;            // a bias on the output projection (Phi)
  bool dropout = false;                // hidden dropout after attention and MLP (stores 1-byte masks)
  bool attention_dropout = false;      // dropout on the attention probabilities (unfused: a 1-byte s×s mask)
  bool qk_layernorm = false;           // norms on queries and keys (Megatron --qk-layernorm)
  std::int64_t learned_positions = 0;  // rows of a learned position embedding (0: RoPE)
  // Mixture of experts: 0 experts = dense MLP.
  std::int64_t num_experts = 0;
  std::int64_t experts_per_token = 0;
  std::int64_t moe_ffn_hidden_size = 0;  // an expert's ffn width; 0: ffn_hidden_size (Megatron --moe-ffn-hidden-size)
  // Shared experts: one dense MLP of this width beside the routed experts, every token through it,
  // split by TP like a dense MLP (Megatron --moe-shared-expert-intermediate-size; 0: none).
  std::int64_t shared_expert_ffn_hidden_size = 0;
  bool shared_expert_gate = false;  // a Linear(h, 1) and a sigmoid scale the shared output (Qwen2-MoE)
  // Which layers hold the experts when dense layers are mixed in (Megatron --moe-layer-freq; Hugging
  // Face first_k_dense_replace, moe_layer_freq, decoder_sparse_step, mlp_only_layers): one entry per
  // layer, 1 an MoE layer, 0 a dense MLP of ffn_hidden_size. Empty: every layer alike.
  std::vector<std::uint8_t> moe_layer_pattern;
  // A per-expert bias on the routing scores (DeepSeek-V3's e_score_correction_bias, topk_method
  // noaux_tc; Megatron --moe-router-enable-expert-bias): a buffer of num_experts per MoE layer, in the
  // checkpoint and counted with the router.
  bool router_expert_bias = false;
  // Multi-latent attention (DeepSeek-V2/V3, Kimi K2; Megatron --multi-latent-attention): queries
  // from a q_lora_rank-wide latent (0: projected from the hidden state directly), keys and values
  // from a shared kv_lora_rank-wide latent plus one rotary key of qk_rope_head_dim for all heads.
  // A query/key head is qk_head_dim + qk_rope_head_dim wide, a value head v_head_dim. With
  // qk_layernorm the latents are normalised (Megatron: fused into the up projections); no
  // per-head q/k norms. mla_q_input_norm: a norm of hidden_size on the direct query projection's
  // input (Megatron --qk-layernorm without --q-lora-rank fuses one; DeepSeek-V2-Lite has none).
  bool mla = false;
  std::int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool mla_q_input_norm = false;
  // Multi-token prediction (Megatron-LM --mtp-num-layers, multi_token_prediction.py): after the
  // decoder, each MTP layer normalises the embedding of the input shifted once more (enorm) and the
  // previous hidden state (hnorm), projects their concatenation (eh_proj, 2h → h), runs one
  // transformer layer of the decoder's last layer's kind and a final norm; the shared output layer
  // gives each its own loss. 0: none.
  std::int64_t mtp_layers = 0;

  void set_linear_bias(bool on) { qkv_bias = proj_bias = mlp_bias = on; }  // every linear layer (Megatron)
  bool linear_bias() const { return qkv_bias && proj_bias && mlp_bias; }
  std::int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  std::int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_heads; }
  bool moe() const { return num_experts > 0; }
  std::int64_t expert_ffn() const { return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn_hidden_size; }
  bool shared_experts() const { return moe() && shared_expert_ffn_hidden_size > 0; }
  // The weights of one MLP of width f, biases aside: fc1 (2·f outputs when gated) and fc2.
  std::int64_t mlp_weights(std::int64_t f) const { return hidden_size * f * (gated_mlp ? 3 : 2); }
  // Whether layer i (0-based) has the experts; a dense model has none.
  bool moe_layer(std::int64_t i) const {
    return moe() && (moe_layer_pattern.empty() || moe_layer_pattern[static_cast<std::size_t>(i)] != 0);
  }
  // Whether the MTP layers' transformer layers have experts: the kind of the decoder's last layer
  // (pretrain_gpt.py builds them from its spec).
  bool mtp_moe() const { return moe_layer(num_layers - 1); }
  // MoE layers among layers [begin, begin + count).
  std::int64_t moe_layers(std::int64_t begin, std::int64_t count) const;
  // An MoE model with dense layers among its layers.
  bool mixed_layers() const { return moe() && moe_layers(0, num_layers) < num_layers; }
  // Widths of all heads' queries (= keys) and values, and of the attention output (o_proj's input).
  std::int64_t query_width() const {
    return mla ? num_heads * (qk_head_dim + qk_rope_head_dim) : num_heads * head_size();
  }
  std::int64_t key_width() const { return mla ? query_width() : kv_heads() * head_size(); }
  std::int64_t value_width() const { return mla ? num_heads * v_head_dim : kv_heads() * head_size(); }
  std::int64_t attention_output_width() const { return mla ? num_heads * v_head_dim : num_heads * head_size(); }
};

// Parameter counts, split the way parallelism splits them. Per layer means per MoE layer of an
// MoE model (per layer of a dense one); an MoE model's dense layers have dense_mlp instead.
struct ParameterCounts {
  std::int64_t attention = 0;             // per layer: q, k, v, o (+ biases); MLA: every projection
  std::int64_t attention_replicated = 0;  // of attention: MLA's down projections, whole on every TP rank
  std::int64_t mlp_dense = 0;             // per layer: the MLP of a dense model, or the router of an MoE
  std::int64_t mlp_experts = 0;           // per layer: all experts together (0 for dense)
  std::int64_t mlp_shared = 0;            // per layer: the shared experts' fc1 and fc2 (split by TP)
  std::int64_t shared_gate = 0;           // per layer: the shared experts' gate (replicated)
  std::int64_t norms = 0;                 // per layer: the norms (and the q/k norms)
  std::int64_t embedding = 0;             // vocab × hidden (+ learned positions)
  std::int64_t output = 0;                // untied output projection (0 when tied)
  std::int64_t final_norm = 0;
  std::int64_t dense_mlp = 0;     // per dense layer of an MoE model: its MLP of ffn_hidden_size (+ biases)
  std::int64_t layers = 0;        // the model's layers
  std::int64_t dense_layers = 0;  // of them, the dense ones of an MoE model
  // Per MTP layer besides its transformer layer: eh_proj (2h·h, split by TP) and the three norms
  // (enorm, hnorm, final norm; replicated). mtp: all MTP layers, their transformer layers included.
  std::int64_t mtp_projection = 0, mtp_norms = 0, mtp = 0;
  std::int64_t per_layer() const { return attention + mlp_dense + mlp_experts + mlp_shared + shared_gate + norms; }
  std::int64_t per_dense_layer() const { return attention + dense_mlp + norms; }
  // The whole model: dense_layers dense, the rest as per_layer() (theoretical_memory_usage.py:
  // dense and MoE layers).
  std::int64_t total() const {
    return per_layer() * (layers - dense_layers) + per_dense_layer() * dense_layers + embedding + output + final_norm +
           mtp;
  }
};

ParameterCounts count_parameters(const ModelConfig& m, std::int64_t vocab);

// InvalidArgument naming the field for zero or negative sizes and inconsistent heads.
void validate(const ModelConfig& m);

std::vector<std::string> preset_names();
// InvalidArgument listing the known names when `name` is not one (case-insensitive).
ModelConfig preset(std::string_view name);

// Reads the fields of a Hugging Face config.json (hidden_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, tie_word_embeddings,
// num_local_experts, num_experts_per_tok, hidden_act, head_dim, attention_bias, mlp_bias, and the
// MoE widths moe_intermediate_size, shared_expert_intermediate_size, n_shared_experts, and which
// layers are MoE: first_k_dense_replace, moe_layer_freq, decoder_sparse_step, mlp_only_layers, and
// MLA's q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim) with the
// architecture its model_type names (docs/estimate.md). ParseError naming the field; a model_type
// the estimate does not know
// is read as a Llama-style decoder with a line in `warnings` saying so.
ModelConfig model_from_hf_json(const std::string& text, const std::string& name = "config.json",
                               std::vector<std::string>* warnings = nullptr);
// What that warning says of a checkpoint's multi-token-prediction layers; a run that trains them
// (ModelConfig::mtp_layers) drops it (finalize).
inline constexpr std::string_view kMtpNotCounted = "the multi-token-prediction layers are not counted";

}  // namespace stowage::estimate
