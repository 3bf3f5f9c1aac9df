#include "tools/estimate/memory_model.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "stowage/error.hpp"
#include "tools/estimate/expert_parallel.hpp"
#include "tools/estimate/layer_activations.hpp"
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
  // The combined 1F1B schedule warms up with one forward more, which is the forward the plain
  // schedule runs before its first backward: the same chunk-forwards in flight. Then each step runs
  // a forward beside a backward, layer by layer (model_chunk_schedule_plan.py run): the new
  // micro-batch holds one layer more than the old one has released, its chunk's layers beyond the
  // released chunk's when that is smaller, while the loss of neither runs.
  if (p.combined_1f1b && out.layers > 0) {
    std::int64_t most = 0, least = out.layers;
    for (std::int64_t chunk = 0; chunk < p.vpp; ++chunk) {
      most = std::max(most, chunk_layers(c, stage, chunk));
      least = std::min(least, chunk_layers(c, stage, chunk));
    }
    const double layer = std::max(moe_layers > 0 ? moe_per.total() : 0.0, dense_layers > 0 ? dense_per.total() : 0.0);
    working = std::max(working, T * double(1 + most - least) * layer);
  }
  // Selective recompute reruns its modules one layer at a time, an MTP layer's as the others'.
  const bool any_moe = moe_layers > 0 || (mtp_here && m.mtp_moe()),
             any_dense = dense_layers > 0 || (mtp_here && !m.mtp_moe());
  working = std::max({working, any_moe ? T * moe_per.rerun : 0.0, any_dense ? T * dense_per.rerun : 0.0});
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
  if (config.model.mixed_layers() || p.has_layout()) {
    for (std::int64_t r = 1; r < p.pp; ++r) {
      StageMemory m = evaluate_stage(config, r, vocab);
      if (m.peak_reserved > best.peak_reserved) best = std::move(m);
    }
    return best;
  }
  const bool uneven = p.uneven_rules();
  for (std::int64_t r : {uneven && p.pp > 2 ? std::int64_t{1} : std::int64_t{0}, p.pp - 1}) {
    if (r == 0) continue;
    StageMemory m = evaluate_stage(config, r, vocab);
    if (m.peak_reserved > best.peak_reserved) best = std::move(m);
  }
  return best;
}

}  // namespace stowage::estimate
