#include "tools/estimate/memory_model.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "stowage/error.hpp"
#include "tools/estimate/expert_parallel.hpp"
#include "tools/estimate/model_states.hpp"
#include "tools/estimate/moe_activations.hpp"
#include "tools/estimate/muon_states.hpp"

namespace stowage::estimate {

std::int64_t StageMemory::activation_total() const {
  std::int64_t sum = 0;
  for (const auto& a : activations) sum += a.bytes;
  return sum;
}

double korthikanti_layer_bytes(double s, double b, double h, double a, double t, bool sp, bool selective) {
  // Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
  // Table 2 (16-bit activations, 1-byte dropout masks).
  const double sbh = s * b * h, core = selective ? 0.0 : 5.0 * a * s / h;
  if (sp) return sbh / t * (34.0 + core);
  return sbh * (10.0 + 24.0 / t + core / t);
}

double deepspeed_zero2_gpu_bytes(double params, double gpus, bool offload_optimizer) {
  // estimate_zero2_model_states_mem_needs since v0.14.3 (PR #5099): 2·P with offload_optimizer=cpu,
  // else 2·P + 18·P/N.
  return offload_optimizer ? 2.0 * params : 2.0 * params + std::floor(18.0 * params / gpus);
}

double deepspeed_zero2_gpu_bytes_before_0_14_3(double params, double gpus, bool offload_optimizer) {
  // The same function up to v0.14.2: 4·P + 16·P/N (what stage 1 allocates).
  return offload_optimizer ? 2.0 * params : 4.0 * params + std::floor(16.0 * params / gpus);
}

double deepspeed_zero3_gpu_bytes(double params, double largest, double gpus, bool offload_optimizer,
                                 bool offload_params) {
  // estimate_zero3_model_states_mem_needs: 4·largest_layer + {18·P/N, 2·P/N, 0}.
  const double gather = 4.0 * largest;
  if (offload_optimizer && offload_params) return gather;
  if (offload_optimizer) return gather + std::floor(2.0 * params / gpus);
  return gather + std::floor(18.0 * params / gpus);
}

std::int64_t padded_vocab(const RunConfig& c) {
  const std::int64_t div = c.training.vocab_divisor * c.parallel.tp;
  return (c.model.vocab_size + div - 1) / div * div;
}

std::int64_t chunks_in_flight(const RunConfig& c, std::int64_t stage) {
  const auto& p = c.parallel;
  const std::int64_t total = c.training.grad_accumulation * p.vpp;
  if (p.pp == 1) return 1;
  std::int64_t warmup = p.pp - stage - 1;
  if (p.vpp > 1) warmup = 2 * (p.pp - stage - 1) + (p.vpp - 1) * (p.microbatch_group > 0 ? p.microbatch_group : p.pp);
  return std::min(warmup + 1, total);
}

namespace {

// Every byte count leaves the model through here: sizes that no device has (beyond 2^62 B)
// are a configuration error, not an integer overflow.
std::int64_t to_bytes(double v, const char* what) {
  if (!(v >= -0x1p62 && v <= 0x1p62))
    throw InvalidArgument(fmt::format("configuration too large: {} would exceed 2^62 bytes", what));
  return std::llround(v);
}

// Bytes per token of one transformer layer for one micro-batch on this device, by kind.
// Generalises Korthikanti et al. 2022 (Section 4.1) to GQA, gated MLPs, flash attention, MoE and
// fp32 training; with 16-bit activations, MHA, GeLU, ffn = 4h, dropout and no flash it is exactly
// 34·h + 5·a·s (their eq. 1).
// Activations of activation_bytes() each; dropout masks stay 1 byte.

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

struct LayerBytes {
  double attention = 0, core_attention = 0, mlp = 0, act_output = 0, router = 0;
  double total() const { return attention + core_attention + mlp + act_output + router; }
};

// One layer's bytes: an MoE layer's (`moe_layer`) or a dense layer's, whose MLP is ffn_hidden_size wide.
LayerBytes layer_bytes_per_token(const RunConfig& c, bool moe_layer) {
  const auto& m = c.model;
  const auto& p = c.parallel;
  const double h = double(m.hidden_size), a = double(m.num_heads), d = double(m.head_size());
  const double kv = double(m.kv_heads()), F = double(m.ffn_hidden_size), t = double(p.tp);
  // Without sequence parallelism, norm inputs, the QKV/fc1 inputs and dropout masks are
  // replicated on every TP rank (the "10" of 10 + 24/t); with it they are split too.
  const double rep = p.sequence_parallel ? t : 1.0;
  const double mask = m.dropout ? 1.0 : 0.0, A = activation_bytes(c);
  LayerBytes l;
  // Attention block incl. both norms (MindSpeed's swap-modules default: input_norm,
  // self_attention, post_attention_norm), in elements of A bytes: LN1 input h, QKV input h, Q ad,
  // K and V kv·d each, output-projection input ad, LN2 input h; the dropout mask h bytes.
  l.attention = (A * 3 * h + mask * h) / rep + A * (2 * a * d + 2 * kv * d) / t;
  // QK layernorm keeps the normalised queries and keys as well as their inputs: ad + kv·d.
  if (m.qk_layernorm && !m.mla) l.attention += A * (a * d + kv * d) / t;
  if (m.mla) l.attention = (A * (3 * h + mla_latent_elements(m)) + mask * h) / rep + A * mla_head_elements(m) / t;
  // Core attention: softmax a·s elements, its dropout mask a·s bytes and the dropout output a·s
  // elements per token (5as with 16-bit activations; the softmax alone without attention dropout);
  // selective recompute drops them, flash attention never stores them (only the fp32 log-sum-exp).
  const double s = double(c.training.seq_length);
  if (c.training.flash_attention) l.core_attention = 4 * a / t;
  else if (c.recompute.granularity != Recompute::selective)
    l.core_attention = a * s * (m.attention_dropout ? 2 * A + 1 : A) / t;
  // MLP: fc1 input h, activation input F (2·F gated), dropout mask h bytes.
  l.mlp = (A * h + mask * h) / rep + A * F * (m.gated_mlp ? 2 : 1) / t;
  // Activation output (fc2's input) F; unfused SwiGLU also keeps silu(x1) for the product.
  l.act_output = A * F / t * (m.gated_mlp && !c.training.fused_swiglu ? 2 : 1);
  if (moe_layer) {  // routed experts, gathered over ETP·EP and kept per copy (moe_activations.cpp)
    const MoeLayerBytes e = moe_layer_bytes_per_token(c);
    l.mlp = e.mlp;
    l.act_output = e.act_output;
    l.router = e.router;
  }
  return l;
}

struct StageParams {
  double dense = 0, expert = 0, largest_layer = 0;  // on this device, after TP/EP split
};

// What a pipeline stage holds besides its layers: the embedding (first), the output layer (last),
// the decoder's final norm, the MTP layers' own parameters.
struct StageHolds {
  bool first = false, last = false, final_norm = false, mtp = false;
};

// `moe_layers` MoE layers and `dense_layers` dense ones (every layer of a dense model is dense).
StageParams stage_params(const RunConfig& c, std::int64_t moe_layers, std::int64_t dense_layers, StageHolds holds,
                         std::int64_t vocab) {
  const bool first = holds.first, last = holds.last;
  const auto& m = c.model;
  const auto& p = c.parallel;
  const ParameterCounts pc = count_parameters(m, vocab);
  const double t = double(p.tp), h = double(m.hidden_size);
  StageParams s;
  // Megatron-LM: column- and row-parallel weights, column-parallel biases and the vocabulary
  // split by TP; norms, row-parallel biases (output projection, fc2) and learned position
  // embeddings replicated on every TP rank. The first stage holds the embedding, the last the
  // output layer (a copy of the tied embedding when PP > 1).
  // An MoE layer's dense MLP part is its router, replicated too.
  const double proj_bias = m.proj_bias ? h : 0.0, fc2_bias = m.mlp_bias ? h : 0.0;
  // Shared experts are a dense MLP split by TP (no biases); their gate is replicated, as the
  // router (theoretical_memory_usage.py: tp_sharded / replicated params of an MoE layer). A dense
  // layer of an MoE model has a dense model's MLP.
  const double dense_mlp = double(m.moe() ? pc.dense_mlp : pc.mlp_dense);
  // MLA's down projections are replicated too.
  const double attn_replicated = proj_bias + double(pc.attention_replicated);
  const double moe_replicated = double(pc.norms) + attn_replicated + double(pc.mlp_dense) + double(pc.shared_gate);
  const double moe_sharded = double(pc.attention) - attn_replicated + double(pc.mlp_shared);
  const double dense_replicated = double(pc.norms) + attn_replicated + fc2_bias;
  const double dense_sharded = double(pc.attention) - attn_replicated + dense_mlp - fc2_bias;
  double sharded = moe_sharded * double(moe_layers) + dense_sharded * double(dense_layers);
  double replicated = moe_replicated * double(moe_layers) + dense_replicated * double(dense_layers);
  if (first) {
    sharded += double(vocab) * h;
    replicated += double(m.learned_positions) * h;
  }
  if (holds.final_norm) replicated += double(pc.final_norm);
  if (last) {
    if (!m.tie_embeddings || p.pp > 1) sharded += double(vocab) * h;
    if (m.output_bias) sharded += double(vocab);
  }
  if (holds.mtp) {
    // The MTP layers (their transformer layers are among the caller's counts): eh_proj and three
    // norms each; their model chunk builds the embedding they read unless it is the first stage's
    // one chunk, which has it already (gpt_model.py: pre_process or mtp_process; with virtual
    // stages each chunk is a model of its own).
    sharded += double(m.mtp_layers * pc.mtp_projection) + (!first || p.vpp > 1 ? double(vocab) * h : 0.0);
    replicated += double(m.mtp_layers * pc.mtp_norms);
  }
  s.dense = sharded / t + replicated;
  s.expert = expert_params_per_rank(c, moe_layers);  // split by ETP and EP (expert_parallel.cpp)
  const double emb = (first || last) ? double(vocab) * h / t : 0.0;
  // DeepSpeed's "largest layer" is the largest single module (nn.Linear / nn.Embedding).
  const double per_linear = h *
                            std::max({double(m.query_width()), double(m.ffn_hidden_size),
                                      double(m.shared_experts() ? m.shared_expert_ffn_hidden_size : 0)}) /
                            t;
  s.largest_layer = std::max(emb, per_linear);
  return s;
}

// One micro-batch through one model chunk of `n` layers from `first_layer` on: the MoE and dense
// layers whose activations stay stored, the layers full recompute rematerialises, the checkpointed
// inputs it keeps, and the bytes per token it rematerialises at once in backward (Megatron-LM
// transformer_block.py _checkpointed_forward: `uniform` checkpoints every group of num_layers
// layers and reruns a group at a time; `block` the first num_layers layers, one at a time).
struct ChunkActivations {
  double moe = 0, dense = 0, recomputed = 0, inputs = 0, working = 0;
};

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

// One micro-batch through the k MTP layers, bytes per token (multi_token_prediction.py). Each
// layer keeps its transformer layer's activations, the shifted token ids (8 B) its embedding
// keeps and the embedding's dropout mask, enorm's input (h), eh_proj's input (the concatenation,
// 2h) and its final norm's input (h); each output but the last is the next layer's hnorm input
// (h). The decoder's normalised output is the first hnorm's input (h), and the output layers read
// their inputs from the concatenation of it with every MTP output ((1 + k)·h, process_mtp_loss):
// (6k)·h more than the output layer alone keeps. On a rank of their own before the last (a
// pipeline layout's), the concatenation is sent on and freed, and the decoder's normalised output
// is the input the rank received. With sequence parallelism eh_proj's output is
// gathered whole and scattered as a view (mappings.py _split_along_first_dim), which the layer's
// input norm keeps: the whole h, not h/t. Full recompute with the uniform method checkpoints each
// MTP layer (keeping the embedding, h, besides its hidden input) and reruns one in backward, its
// 4h and the whole input included; Megatron-LM does not recompute them with the block method.
struct MtpActivations {
  double stored = 0, working = 0;
};

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

StageMemory evaluate_stage(const RunConfig& c, std::int64_t stage, std::int64_t vocab) {
  const auto& m = c.model;
  const auto& p = c.parallel;
  const auto& tr = c.training;
  const auto& tech = c.techniques;
  const bool first = stage == 0, last = stage == p.pp - 1;
  // The MTP layers run in the last model chunk of mtp_rank() (the last rank unless a layout says).
  const bool mtp_here = m.mtp_layers > 0 && stage == mtp_rank(c),
             mtp_alone = m.mtp_layers > 0 && mtp_rank(c) < p.pp - 1;
  StageMemory out;
  out.stage = stage;
  out.layers = stage_layers(c, stage);
  // Each layer's activations follow its kind: an MoE layer's experts, or a dense layer's MLP.
  const std::int64_t moe_layers = stage_moe_layers(c, stage), dense_layers = out.layers - moe_layers;
  const LayerBytes dense_per = layer_bytes_per_token(c, false);
  const LayerBytes moe_per = m.moe() ? layer_bytes_per_token(c, true) : dense_per;
  // Layer-micro-batches whose activations the stage holds at its peak: the chunk-forwards in
  // flight (chunks_in_flight), in the interleaved schedule's order — `group` micro-batches
  // through chunk 0, then through chunk 1, … (schedules.py) — each with its chunk's layers.
  // Full recompute applies per model chunk. Reported as micro-batches of the stage's layers.
  const std::int64_t group = p.vpp > 1 ? (p.microbatch_group > 0 ? p.microbatch_group : p.pp) : 1;
  double units = 0, stored_moe = 0, stored_dense = 0, recomputed = 0, checkpoint_inputs = 0, working_per_token = 0;
  std::int64_t mtp_in_flight = 0;   // forwards through the chunk that runs the MTP layers
  std::int64_t norm_in_flight = 0;  // forwards through the chunk that runs the final norm
  const ChunkPlace norm = final_norm_place(c);
  for (std::int64_t i = 0, n = chunks_in_flight(c, stage); i < n; ++i) {
    const std::int64_t chunk = (i / group) % p.vpp, layers = chunk_layers(c, stage, chunk);
    if (mtp_here && chunk == p.vpp - 1) ++mtp_in_flight;
    if (stage == norm.rank && chunk == norm.chunk) ++norm_in_flight;
    const ChunkActivations f = chunk_activations(c, chunk_first_layer(c, stage, chunk), layers, moe_per, dense_per);
    units += double(layers);
    stored_moe += f.moe;
    stored_dense += f.dense;
    recomputed += f.recomputed;
    checkpoint_inputs += f.inputs;
    working_per_token = std::max(working_per_token, f.working);
  }
  out.microbatches_in_flight = out.layers > 0 ? units / double(out.layers) : 0.0;

  const double T = double(tr.micro_batch) * double(tr.seq_length) / double(p.cp);  // tokens on this rank
  const double h = double(m.hidden_size), t = double(p.tp), rep = p.sequence_parallel ? t : 1.0;
  const double A = activation_bytes(c);
  const LayerBytes& per = dense_per;  // attention is the same in both kinds of layer

  // Full recompute keeps each checkpointed chunk's input, A·s·b·h (÷ t with SP) (Korthikanti §4);
  // MindSpeed: activation-function recompute covers the layers full recompute leaves stored.
  const double stored_units = stored_moe + stored_dense;
  const bool act_fn = tech.act_fn_recompute || c.recompute.granularity == Recompute::activation_function;
  double act_fn_units = act_fn ? stored_units : 0.0;
  if (act_fn && recomputed == 0 && c.recompute.num_layers)
    act_fn_units = std::min<double>(double(c.recompute.num_layers), double(out.layers)) * out.microbatches_in_flight;
  const double act_fn_share = stored_units > 0 ? act_fn_units / stored_units : 0.0;  // of either kind

  double attention = T * (per.attention + per.core_attention) * stored_units;
  double core = 0.0;  // reported with attention when swapped; kept apart otherwise
  if (!tech.swap_attention) {
    attention = T * per.attention * stored_units;
    core = T * per.core_attention * stored_units;
  }
  double mlp = T * (moe_per.mlp * stored_moe + dense_per.mlp * stored_dense) + T * A * h / rep * checkpoint_inputs;
  // Activation-function recompute (MindSpeed, docs/features/activation-function-recompute.md):
  // the activation output is released after fc2's forward and recomputed before fc2's backward.
  double act_out = T * (moe_per.act_output * stored_moe + dense_per.act_output * stored_dense) * (1.0 - act_fn_share);
  double router = T * moe_per.router * stored_moe;
  // Rematerialised in backward: the layers full recompute runs at once, or one activation output.
  double working = T * working_per_token;
  // The MTP layers of the last stage, with no technique of stowage's applied to them.
  const MtpActivations mtp =
      mtp_here ? mtp_activations(c, m.mtp_moe() ? moe_per : dense_per, mtp_alone) : MtpActivations{};
  working = std::max(working, T * mtp.working);
  if (act_fn_units > 0)
    working = std::max(
        {working, moe_layers > 0 ? T * moe_per.act_output : 0.0, dense_layers > 0 ? T * dense_per.act_output : 0.0});
  // Swap-attention (MindSpeed --swap-attention): attention activations go to pinned host memory
  // after forward and come back ahead of backward; the prefetch window's layers stay resident.
  if (tech.swap_attention && stored_units > 0) {
    const double resident = std::min<double>(stored_units, double(tech.prefetch_window));
    const double per_unit = attention / stored_units;
    out.swapped_bytes = to_bytes(per_unit * (stored_units - resident), "swapped activations");
    out.host_bytes += out.swapped_bytes;
    attention = per_unit * resident;
  }
  // Embedding input (8 B per token) and its dropout mask, for every micro-batch in flight
  // (Megatron-LM theoretical_memory_usage.py).
  const double embedding = first ? out.microbatches_in_flight * T * (8.0 + (m.dropout ? h / rep : 0.0)) : 0.0;
  // Output layer and loss, one micro-batch (the last chunk computes it once per 1F1B step):
  // final-norm input and output-layer input (2h elements, ÷ t with SP), the logits (2 B each, V/t
  // per TP rank) and the fp32 copy Megatron's vocab-parallel cross-entropy makes and keeps as
  // the softmax for backward (4 B) — both alive while the loss runs (cross_entropy.py). In fp32
  // training .float() is the logits themselves, turned into the softmax in place: 4 B.
  const bool mixed = tr.precision != Precision::fp32;
  const double logit_bytes = mixed ? tr.loss_bytes_per_logit : 4.0;
  // Each MTP loss runs before the main one and keeps its fp32 softmax (4 B) until backward.
  const double mtp_logit_bytes = 4.0 * double(m.mtp_layers);
  const double loss_peak = last ? T * (logit_bytes + mtp_logit_bytes) * double(vocab) / t : 0.0;
  // The final norm keeps its input for each micro-batch in flight through its chunk: the
  // post-process chunk, or with MTP the last decoder layer's (final_norm_place). The last stage's
  // output layer reads the normalised output (with MTP on this stage, hnorm's input), or from MTP
  // on a rank of its own the (1 + k)-fold concatenation it received.
  const double H = A * h / rep;
  double output_inputs = T * H * double(norm_in_flight);
  if (last) output_inputs += T * H * (mtp_alone ? double(1 + m.mtp_layers) : 1.0);
  // Deferred output-layer weight gradients: each waiting call's logits gradient and input, 1 + k
  // calls per micro-batch with MTP (layers.py: the limit counts calls).
  if (last && tr.deferred_wgrad_microbatches > 0)
    output_inputs += double(std::min(tr.deferred_wgrad_microbatches, tr.grad_accumulation * (1 + m.mtp_layers))) * T *
                     (A * double(vocab) / t + A * h / rep);
  // The loss's peak and the backward rematerialisation do not overlap: the softmax is consumed
  // before the first layer's backward. The stage's peak is the larger one on top of what is stored.
  const double working_extra = std::max(0.0, working - loss_peak);

  out.activations = {{"attention", to_bytes(attention, "attention")},
                     {"core_attention", to_bytes(core, "core_attention")},
                     {"mlp", to_bytes(mlp, "mlp")},
                     {"mlp_activation_output", to_bytes(act_out, "mlp_activation_output")},
                     {"moe_router", to_bytes(router, "moe_router")},
                     {"mtp", to_bytes(T * mtp.stored * double(mtp_in_flight), "mtp")},
                     {"embedding", to_bytes(embedding, "embedding")},
                     {"output_logits", to_bytes(output_inputs + loss_peak, "output_logits")},
                     {"recompute_working_set", to_bytes(working_extra, "recompute_working_set")}};

  // Model states: dense parameters shard over DP·CP, experts over the expert-data-parallel group.
  // The MTP layers' transformer layers are of the last layer's kind.
  const std::int64_t mtp_layers = mtp_here ? m.mtp_layers : 0, mtp_moe = m.mtp_moe() ? mtp_layers : 0;
  out.mtp_layers = mtp_layers;
  const std::int64_t param_moe = moe_layers + mtp_moe, param_dense = dense_layers + mtp_layers - mtp_moe;
  const StageParams sp = stage_params(c, param_moe, param_dense, {first, last, stage == norm.rank, mtp_here}, vocab);
  out.parameters = to_bytes(sp.dense + sp.expert, "parameters");
  // validate(): instances divide DP·CP and the expert-data-parallel size.
  const double n_dense = double(p.dp * p.cp) / double(p.optimizer_instances);
  const double n_expert = m.moe() ? expert_state_shards(c) : 1.0;
  // Muon orthogonalises the 2-D weights only (muon_states.cpp); other optimizers treat all alike.
  const double mtp_projections = double(mtp_layers) * 2.0 * h * h / t;  // eh_proj is 2-D: Muon's
  const States dense =
      stage_states(c, sp.dense, muon_matrix_params(c, param_moe, param_dense, first, false) + mtp_projections, n_dense,
                   sp.largest_layer);
  const States expert =
      stage_states(c, sp.expert, muon_matrix_params(c, param_moe, param_dense, first, true), n_expert, 0.0);
  out.weights = to_bytes(dense.weights + expert.weights, "weights");
  out.gradients = to_bytes(dense.gradients + expert.gradients, "gradients");
  out.optimizer_states = to_bytes(dense.optimizer + expert.optimizer, "optimizer states");
  out.host_bytes += to_bytes(dense.host + expert.host, "host bytes");
  out.optimizer_step = to_bytes(dense.step_only + expert.step_only, "optimizer step");

  // Communication buffers alive at the peak: the pipeline receive of the next micro-batch's
  // input (s·b·h elements, ÷ t with SP), the MoE dispatch buffers (moe_activations.cpp), and
  // DeepSpeed's reduce buckets (reduce_bucket_size, twice with overlap_comm at ZeRO-1/2) and
  // ZeRO-3's prefetch bucket; ZeRO-1/2 all-gather into the flat weights (no bucket), stage 0 has none.
  // Megatron's gradient buckets are views into the gradient buffer (counted with the gradients).
  double comm = 0.0;
  // From MTP on a rank of its own on, the stages receive its (1 + k)-fold output or, on its rank,
  // that output's gradient (shapes exchanged at run time, p2p_communication.py).
  if (p.pp > 1) comm += T * A * h / rep * (mtp_alone && stage >= mtp_rank(c) ? double(1 + m.mtp_layers) : 1.0);
  if (param_moe > 0) comm += moe_dispatch_buffer_bytes(c, T);  // moe_activations.cpp
  const double W = mixed ? 2.0 : 4.0;
  // The BF16_Optimizer is no ZeRO optimizer: it reduces without ZeRO's bucket.
  if (!deepspeed_bf16_optimizer(c))
    comm += W * (double(p.reduce_bucket_elements) * double(p.reduce_buffers) + double(p.allgather_bucket_elements));
  out.communication = to_bytes(comm, "communication buffers");
  out.framework = c.framework.total();
  // TransformerEngine allocates the grouped GEMM's workspaces at its first grouped GEMM
  // (cpp_extensions/gemm.py get_cublas_workspace, lru_cache): a stage without MoE layers runs none.
  if (param_moe == 0) out.framework -= c.framework.te_workspace * c.framework.te_grouped_gemm_workspaces;

  out.optimizer_step_beyond_activations = std::max<std::int64_t>(0, out.optimizer_step - out.activation_total());
  double total = double(out.model_states()) + double(out.communication) + double(out.framework) +
                 double(out.optimizer_step_beyond_activations);
  for (const auto& a : out.activations) total += double(a.bytes);
  out.peak_allocated = to_bytes(total, "peak allocated");
  // Caching-allocator overhead (reserved − allocated): a fraction of the peak, 5 % by default
  // as in Megatron-LM's report (overhead_factor = 1.05 for temporaries).
  out.allocator_overhead = to_bytes(double(out.peak_allocated) * c.allocator_overhead, "allocator overhead");
  out.peak_reserved = to_bytes(double(out.peak_allocated) + double(out.allocator_overhead), "peak reserved");
  return out;
}

}  // namespace

StageMemory estimate_stage(const RunConfig& config, std::int64_t stage) {
  validate(config);
  if (stage < 0 || stage >= config.parallel.pp)
    throw InvalidArgument(fmt::format("stage must be 0..{}, got {}", config.parallel.pp - 1, stage));
  return evaluate_stage(config, stage, padded_vocab(config));
}

StageMemory estimate_memory(const RunConfig& config) {
  validate(config);
  const std::int64_t vocab = padded_vocab(config);
  if (config.stage >= 0) return evaluate_stage(config, config.stage, vocab);
  const auto& p = config.parallel;
  if (p.pp == 1) return evaluate_stage(config, 0, vocab);
  // Evenly split, the first stage (most micro-batches in flight, the embedding) or the last (the
  // loss) is the most loaded. Unevenly split, the second stage is the middle stage with the most
  // in flight and may hold more layers than either.
  StageMemory best = evaluate_stage(config, 0, vocab);
  // Dense layers mixed among the MoE layers, or a layout's own split, make any stage the most
  // loaded one: each is evaluated.
  if (config.model.mixed_layers() || !p.layout_layers.empty()) {
    for (std::int64_t r = 1; r < p.pp; ++r) {
      StageMemory m = evaluate_stage(config, r, vocab);
      if (m.peak_reserved > best.peak_reserved) best = std::move(m);
    }
    return best;
  }
  const bool uneven = p.first_stage_layers > 0 || p.last_stage_layers > 0 || p.embedding_as_layer || p.loss_as_layer;
  for (std::int64_t r : {uneven && p.pp > 2 ? std::int64_t{1} : std::int64_t{0}, p.pp - 1}) {
    if (r == 0) continue;
    StageMemory m = evaluate_stage(config, r, vocab);
    if (m.peak_reserved > best.peak_reserved) best = std::move(m);
  }
  return best;
}

}  // namespace stowage::estimate
