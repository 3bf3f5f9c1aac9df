#include "tools/estimate/layer_activations.hpp"

#include <algorithm>

#include "tools/estimate/moe_activations.hpp"

namespace stowage::estimate {

namespace {

// Multi-latent attention (Megatron-LM multi_latent_attention.py, default path): the input norm
// (TENorm) keeps its input and the duplicated down projections share its output as their saved
// input (the 3h with LN2's input, as for standard attention), on the sequence-parallel shard. Per
// token of that shard: linear_q_up_proj keeps q_compressed (q_lora_rank) and, with its fused
// --qk-layernorm norm, the normalised copy; linear_kv_up_proj keeps kv_compressed, a view that
// holds all of kv_combined (kv_lora_rank + qk_pos_emb_head_dim), and its normalised copy; without
// q_lora_rank the fused norm of --qk-layernorm on linear_q_proj keeps its output (h). The rotary
// embedding (apply_rotary_pos_emb, or the fused MLA rope) keeps only cos/sin; the up projections'
// outputs are consumed by the concatenation (or rotated in place).
double mla_latent_elements(const ModelConfig& m) {
  const double qr = double(m.q_lora_rank), kr = double(m.kv_lora_rank), norm = m.qk_layernorm ? 1.0 : 0.0;
  const double q = m.q_lora_rank > 0 ? qr * (1 + norm) : (m.mla_q_input_norm ? double(m.hidden_size) : 0.0);
  return q + kr + double(m.qk_rope_head_dim) + norm * kr;
}
// Per token on a TP rank (÷ t): the core attention keeps the up-projected query and key (heads ·
// (qk_head_dim + qk_pos_emb_head_dim) each) and the value (heads · v_head_dim); linear_proj keeps
// the attention output (heads · v_head_dim).
double mla_head_elements(const ModelConfig& m) {
  return double(m.query_width() + m.key_width() + m.value_width() + m.attention_output_width());
}

}  // namespace

LayerBytes layer_bytes_per_token(const RunConfig& c, bool moe_layer) {
  const auto& m = c.model;
  const auto& p = c.parallel;
  const auto& r = c.recompute;
  const double h = double(m.hidden_size), a = double(m.num_heads), d = double(m.head_size());
  const double kv = double(m.kv_heads()), F = double(m.ffn_hidden_size), t = double(p.tp);
  // Without sequence parallelism, norm inputs, the QKV/fc1 inputs and dropout masks are
  // replicated on every TP rank (the "10" of 10 + 24/t); with it they are split too.
  const double rep = p.sequence_parallel ? t : 1.0;
  const double mask = m.dropout ? 1.0 : 0.0, A = activation_bytes(c);
  LayerBytes l;
  // What selective recompute rematerialises at once in backward: the attention's modules during
  // its backward, the MLP's during its own (one after the other, so the larger of the two).
  double attention_rerun = 0, mlp_rerun = 0;
  // Attention block incl. both norms (MindSpeed's swap-modules default: input_norm,
  // self_attention, post_attention_norm), in elements of A bytes: LN1 input h, QKV input h, Q ad,
  // K and V kv·d each, output-projection input ad, LN2 input h; the dropout mask h bytes.
  l.attention = (A * 3 * h + mask * h) / rep + A * (2 * a * d + 2 * kv * d) / t;
  // QK layernorm keeps the normalised queries and keys as well as their inputs: ad + kv·d.
  if (m.qk_layernorm && !m.mla) l.attention += A * (a * d + kv * d) / t;
  if (m.mla) {
    double latent = mla_latent_elements(m), heads = mla_head_elements(m) / t;
    // mla_up_proj: the up projections and the rotary embedding keep only their inputs, the
    // latents (q_compressed, kv_combined); the query, key and value the core attention saved
    // are released and recomputed before linear_proj's backward (multi_latent_attention.py).
    if (r.recomputes(RecomputeModule::mla_up_proj)) {
      const double kept = double(m.q_lora_rank) + double(m.kv_lora_rank) + double(m.qk_rope_head_dim);
      const double up = double(m.query_width() + m.key_width() + m.value_width()) / t;
      attention_rerun += A * ((latent - kept) / rep + up);
      latent = kept;
      heads -= up;
    }
    l.attention = (A * (3 * h + latent) + mask * h) / rep + A * heads;
  }
  // layernorm: a norm that is a module of its own releases its output (the next linear's saved
  // input) and recomputes it from its input before the consumers' backward (transformer_layer.py).
  const bool norm_alone = m.mla || !c.training.fused_norms;
  if (norm_alone && r.recomputes(RecomputeModule::layernorm)) {
    l.attention -= A * h / rep;
    attention_rerun += A * h / rep;
  }
  // Core attention: softmax a·s elements, its dropout mask a·s bytes and the dropout output a·s
  // elements per token (5as with 16-bit activations; the softmax alone without attention dropout);
  // selective recompute of core_attn drops them and reruns them in backward, flash attention never
  // stores them (only the fp32 log-sum-exp).
  const double s = double(c.training.seq_length);
  if (c.training.flash_attention) {
    l.core_attention = 4 * a / t;
  } else {
    const double scores = a * s * (m.attention_dropout ? 2 * A + 1 : A) / t;
    if (r.recomputes(RecomputeModule::core_attn)) attention_rerun += scores;
    else l.core_attention = scores;
  }
  if (moe_layer) {  // routed experts, gathered over ETP·EP and kept per copy (moe_activations.cpp)
    const MoeLayerBytes e = moe_layer_bytes_per_token(c);
    l.mlp = e.mlp;
    l.act_output = e.act_output;
    l.router = e.router;
    mlp_rerun = e.rerun;
  } else {
    // MLP: fc1 input h, activation input F (2·F gated), dropout mask h bytes.
    const double fc1_input = A * h / rep;
    l.mlp = fc1_input + mask * h / rep + A * F * (m.gated_mlp ? 2 : 1) / t;
    // Activation output (fc2's input) F; unfused SwiGLU also keeps silu(x1) for the product.
    l.act_output = A * F / t * (m.gated_mlp && !c.training.fused_swiglu ? 2 : 1);
    // mlp: the checkpointed MLP keeps its input, the pre-MLP norm's output where that norm is a
    // module of its own, else the LN2 input counted above; layernorm releases that norm's output.
    const bool norm_recomputed = !c.training.fused_norms && r.recomputes(RecomputeModule::layernorm);
    if (r.recomputes(RecomputeModule::mlp)) {
      mlp_rerun = l.mlp - mask * h / rep + l.act_output;
      const bool input_kept = !c.training.fused_norms && !norm_recomputed;
      l.mlp = mask * h / rep + (input_kept ? fc1_input : 0.0);
      l.act_output = 0;
    } else if (norm_recomputed) {
      l.mlp -= fc1_input;
    }
    if (norm_recomputed) mlp_rerun += fc1_input;
  }
  l.rerun = std::max(attention_rerun, mlp_rerun);
  return l;
}

ChunkActivations chunk_activations(const RunConfig& c, std::int64_t first_layer, std::int64_t n, const LayerBytes& moe,
                                   const LayerBytes& dense) {
  const auto& m = c.model;
  ChunkActivations f;
  auto bytes = [&](std::int64_t begin, std::int64_t count) {
    const std::int64_t k = m.moe_layers(begin, count);
    return double(k) * moe.total() + double(count - k) * dense.total();
  };
  std::int64_t recomputed = 0;  // the chunk's first layers
  if (c.recompute.granularity == Recompute::full) {
    const std::int64_t r = c.recompute.num_layers;
    if (c.recompute.method == RecomputeMethod::uniform) {
      const std::int64_t group = r > 0 ? std::min(r, n) : 1;
      recomputed = n;
      const std::int64_t groups = n > 0 ? (n + group - 1) / group : 0;
      f.inputs = double(groups);
      for (std::int64_t b = 0; b < n; b += group)
        f.working = std::max(f.working, bytes(first_layer + b, std::min(group, n - b)));
    } else {
      recomputed = r > 0 ? std::min(r, n) : n;
      f.inputs = double(recomputed);
      for (std::int64_t b = 0; b < recomputed; ++b) f.working = std::max(f.working, bytes(first_layer + b, 1));
    }
  }
  f.recomputed = double(recomputed);
  f.moe = double(m.moe_layers(first_layer, n) - m.moe_layers(first_layer, recomputed));
  f.dense = double(n - recomputed) - f.moe;
  return f;
}

MtpActivations mtp_activations(const RunConfig& c, const LayerBytes& layer, bool own_rank) {
  const auto& m = c.model;
  const double k = double(m.mtp_layers);
  if (k == 0) return {};
  const double rep = c.parallel.sequence_parallel ? double(c.parallel.tp) : 1.0;
  const double H = activation_bytes(c) * double(m.hidden_size) / rep;  // one hidden state
  const double ids = 8.0 + (m.dropout ? double(m.hidden_size) / rep : 0.0);
  // The next hnorm inputs, and the concatenation or (on their own rank) the received input.
  const double outputs = (k - 1) * H + (own_rank ? H : (1 + k) * H);
  const double whole_input = H * (rep - 1);  // the scattered view's base beyond its shard
  const double rerun = layer.total() + 4 * H + whole_input;
  const bool checkpointed =
      c.recompute.granularity == Recompute::full && c.recompute.method == RecomputeMethod::uniform;
  if (checkpointed) return {k * (ids + H) + outputs, rerun};
  return {k * (ids + rerun) + outputs, 0.0};
}

}  // namespace stowage::estimate
