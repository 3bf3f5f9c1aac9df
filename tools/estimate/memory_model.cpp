#include "tools/estimate/memory_model.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "stowage/error.hpp"

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
  // estimate_zero2_model_states_mem_needs: 2·P with offload_optimizer=cpu, else 4·P + 16·P/N.
  return offload_optimizer ? 2.0 * params : 4.0 * params + std::floor(16.0 * params / gpus);
}

double deepspeed_zero3_gpu_bytes(double params, double largest, double gpus, bool offload_optimizer, bool offload_params) {
  // estimate_zero3_model_states_mem_needs: 4·largest_layer + {18·P/N, 2·P/N, 0}.
  const double gather = 4.0 * largest;
  if (offload_optimizer && offload_params) return gather;
  if (offload_optimizer) return gather + std::floor(2.0 * params / gpus);
  return gather + std::floor(18.0 * params / gpus);
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
// Generalises Korthikanti et al. 2022 (Section 4.1) to GQA, gated MLPs, flash attention and MoE;
// with MHA, GeLU, ffn = 4h, dropout and no flash it is exactly 34·h + 5·a·s (their eq. 1).
struct LayerBytes {
  double attention = 0, core_attention = 0, mlp = 0, act_output = 0, router = 0;
  double total() const { return attention + core_attention + mlp + act_output + router; }
};

LayerBytes layer_bytes_per_token(const RunConfig& c) {
  const auto& m = c.model;
  const auto& p = c.parallel;
  const double h = double(m.hidden_size), a = double(m.num_heads), d = double(m.head_size());
  const double kv = double(m.kv_heads()), F = double(m.ffn_hidden_size), t = double(p.tp);
  // Without sequence parallelism, norm inputs, the QKV/fc1 inputs and dropout masks are
  // replicated on every TP rank (the "10" of 10 + 24/t); with it they are split too.
  const double rep = p.sequence_parallel ? t : 1.0;
  const double k = m.moe() ? double(m.experts_per_token) : 1.0;
  const double mask = m.dropout ? 1.0 : 0.0;
  LayerBytes l;
  // Attention block incl. both norms (MindSpeed's swap-modules default: input_norm,
  // self_attention, post_attention_norm): LN1 input 2h, QKV input 2h, Q 2ad, K and V 2·kv·d each,
  // output-projection input 2ad, dropout mask h, LN2 input 2h.
  l.attention = (2 * h + 2 * h + mask * h + 2 * h) / rep + (2 * a * d + 4 * kv * d + 2 * a * d) / t;
  // Core attention: softmax 2·a·s, its dropout mask a·s and output 2·a·s per token (5as);
  // selective recompute drops them, flash attention never stores them (only fp32 log-sum-exp).
  const double s = double(c.training.seq_length);
  if (c.training.flash_attention)
    l.core_attention = 4 * a / t;
  else if (c.recompute.granularity != Recompute::selective)
    l.core_attention = a * s * (2 + 3 * mask) / t;
  // MLP: fc1 input 2h (per routed copy for MoE), activation input 2·F (4·F gated), dropout mask h.
  l.mlp = (k * 2 * h + mask * h) / rep + k * 2 * F * (m.gated_mlp ? 2 : 1) / t;
  // Activation output (fc2's input) 2·F; unfused SwiGLU also keeps silu(x1) for the product.
  l.act_output = k * 2 * F / t * (m.gated_mlp && !c.training.fused_swiglu ? 2 : 1);
  if (m.moe()) l.router = 4 * double(m.num_experts) / rep;  // fp32 router probabilities
  return l;
}

struct StageParams {
  double dense = 0, expert = 0, largest_layer = 0;  // on this device, after TP/EP split
};

StageParams stage_params(const RunConfig& c, std::int64_t layers, bool first, bool last, std::int64_t vocab) {
  const auto& p = c.parallel;
  const ParameterCounts pc = count_parameters(c.model, vocab);
  const double t = double(p.tp);
  StageParams s;
  // Megatron-LM's theoretical memory report: every parameter of a stage split by TP; the first
  // stage holds the embedding, the last the output layer (a copy of the tied embedding when PP > 1).
  double dense = double(pc.attention + pc.mlp_dense + pc.norms) * double(layers);
  if (first) dense += double(pc.embedding);
  if (last) {
    dense += double(pc.final_norm);
    if (!c.model.tie_embeddings || p.pp > 1) dense += double(vocab) * double(c.model.hidden_size);
  }
  s.dense = dense / t;
  s.expert = double(pc.mlp_experts) * double(layers) / (t * double(p.ep));
  const double h = double(c.model.hidden_size);
  const double emb = (first || last) ? double(vocab) * h / t : 0.0;
  // DeepSpeed's "largest layer" is the largest single module (nn.Linear / nn.Embedding).
  const double per_linear = h * std::max(double(c.model.num_heads * c.model.head_size()), double(c.model.ffn_hidden_size)) / t;
  s.largest_layer = std::max(emb, per_linear);
  return s;
}

struct States {
  double weights = 0, gradients = 0, optimizer = 0, host = 0;
};

// Model states for `params` parameters sharded over `n` ranks.
// ZeRO paper (Rajbhandari et al. 2020, Section 3 / Figure 1): mixed-precision Adam keeps
// 2Ψ (16-bit weights) + 2Ψ (16-bit grads) + KΨ (K = 12: fp32 master, momentum, variance);
// stage 1 shards KΨ, stage 2 also the gradients, stage 3 also the weights (each ÷ N).
// Megatron-LM keeps fp32 main gradients (4 B; 18 B/param, or 6 + 12/d with the distributed
// optimizer — theoretical_memory_usage.py). DeepSpeed's estimator keeps the 16-bit gradients
// whole and an fp32 gradient partition: 4Ψ + 16Ψ/N (stage 2), 18Ψ/N + 4·largest layer (stage 3).
States model_states(const RunConfig& c, double params, double n, double largest_layer) {
  const auto& tr = c.training;
  const auto& p = c.parallel;
  const auto& tech = c.techniques;
  const bool mixed = tr.precision != Precision::fp32;
  const double W = mixed ? 2 : 4;
  double G = tr.grad_bytes ? tr.grad_bytes : (mixed ? 2 : 4);
  if (p.accounting == Accounting::megatron && !tr.grad_bytes) G = 4;
  const double master = mixed ? 4 : 0, moments = tr.optimizer == Optimizer::adam ? 8 : 4;
  const double K = master + moments;
  const int z = p.zero_stage;
  States s;
  if (p.accounting == Accounting::deepspeed) {
    const double n_opt = z >= 1 ? n : 1;
    if (z == 3) {
      s.weights = (p.offload_param_deepspeed ? 0 : W * params / n) + W * largest_layer;
      s.gradients = (p.offload_optimizer_deepspeed ? 0 : 4 * params / n) + W * largest_layer;
    } else {
      s.weights = W * params;
      s.gradients = p.offload_optimizer_deepspeed ? 0 : W * params + 4 * params / n_opt;
    }
    s.optimizer = p.offload_optimizer_deepspeed ? 0 : K * params / n_opt;
    if (p.offload_optimizer_deepspeed) s.host += (K + 4) * params / n_opt;
    if (z == 3 && p.offload_param_deepspeed) s.host += W * params / n;
  } else {
    s.weights = (z >= 3 ? W * params / n : W * params) + (z >= 3 ? W * largest_layer : 0);
    s.gradients = (z >= 2 ? G * params / n : G * params) + (z >= 3 ? G * largest_layer : 0);
    s.optimizer = z >= 1 ? K * params / n : K * params;
  }
  const double local_master = (z >= 1 ? params / n : params);
  // stowage optimizer offload (DESIGN.md; MindSpeed virtual optimizer / swap-optimizer): the
  // optimizer states leave the device. Mapped: kernels address host memory directly, nothing
  // stays; streamed: a double-buffered window of `stream_window_layers` layers' states.
  const bool master_on_host = tech.optimizer_offload != OffloadMode::none || p.offload_optimizer_deepspeed;
  if (tech.optimizer_offload != OffloadMode::none && !p.offload_optimizer_deepspeed) {
    s.host += s.optimizer;
    const double window = tech.optimizer_offload == OffloadMode::streamed ? 2.0 * double(tech.stream_window_layers) : 0.0;
    const double per_layer_share = c.model.num_layers > 0 ? s.optimizer / double(std::max<std::int64_t>(1, c.model.num_layers / c.parallel.pp)) : 0;
    s.optimizer = std::min(s.optimizer, window * per_layer_share);
  }
  // Shared fp32/bf16 storage (MindSpeed --reuse-fp32-param): the 16-bit weight of every
  // parameter whose fp32 master is on this device lives inside the master: −2 B per such
  // parameter. Round-to-nearest-even needs one extra bit per parameter (DESIGN.md).
  if (tech.shared_storage && mixed && !master_on_host) {
    s.weights -= W * local_master;
    if (tech.rounding == Rounding::nearest_even) s.weights += local_master / 8.0;
  }
  return s;
}

StageMemory evaluate_stage(const RunConfig& c, bool first, bool last, std::int64_t vocab) {
  const auto& m = c.model;
  const auto& p = c.parallel;
  const auto& tr = c.training;
  const auto& tech = c.techniques;
  StageMemory out;
  out.stage = first ? 0 : p.pp - 1;
  out.layers = m.num_layers / p.pp;
  const double Ls = double(out.layers);

  // Micro-batches whose activations the stage holds at its peak. Megatron-LM's report (after
  // Korthikanti et al. Section 4.2.3): the first stage of 1F1B holds min(p, m) micro-batches of
  // L/p layers; the interleaved schedule multiplies by 1 + (p − 1)/(p·v). The last stage holds one.
  double in_flight = 1.0;
  if (first && p.pp > 1) {
    if (p.vpp > 1)
      in_flight = double(p.pp) * (1.0 + double(p.pp - 1) / double(p.pp * p.vpp));
    else
      in_flight = double(std::min(p.pp, tr.grad_accumulation));
  }
  out.microbatches_in_flight = in_flight;

  const double T = double(tr.micro_batch) * double(tr.seq_length) / double(p.cp);  // tokens on this rank
  const double h = double(m.hidden_size), t = double(p.tp), rep = p.sequence_parallel ? t : 1.0;
  const LayerBytes per = layer_bytes_per_token(c);

  // Full recompute (Korthikanti Section 4): a recomputed layer keeps only its input, 2·s·b·h
  // (÷ t with SP). MindSpeed: full-recompute layers come first, activation-function recompute
  // covers the rest; both rematerialise one layer at a time in backward (the working set).
  const bool full = c.recompute.granularity == Recompute::full;
  const bool act_fn = tech.act_fn_recompute || c.recompute.granularity == Recompute::activation_function;
  const double full_layers = full ? (c.recompute.num_layers ? std::min<double>(Ls, double(c.recompute.num_layers)) : Ls) : 0.0;
  const double stored_layers = Ls - full_layers;
  double act_fn_layers = act_fn ? stored_layers : 0.0;
  if (act_fn && !full && c.recompute.num_layers) act_fn_layers = std::min<double>(Ls, double(c.recompute.num_layers));
  const double stored_units = stored_layers * in_flight, act_fn_units = act_fn_layers * in_flight;

  double attention = T * (per.attention + per.core_attention) * stored_units;
  double core = 0.0;  // reported with attention when swapped; kept apart otherwise
  if (!tech.swap_attention) {
    attention = T * per.attention * stored_units;
    core = T * per.core_attention * stored_units;
  }
  double mlp = T * per.mlp * stored_units;
  // Activation-function recompute (MindSpeed, docs/features/activation-function-recompute.md):
  // the activation output is released after fc2's forward and recomputed before fc2's backward.
  double act_out = T * per.act_output * (stored_units - act_fn_units);
  double router = T * per.router * stored_units;
  double working = 0.0;
  if (full_layers > 0) {
    mlp += T * 2.0 * h / rep * full_layers * in_flight;  // each recomputed layer's input
    working = std::max(working, T * per.total());
  }
  if (act_fn_units > 0) working = std::max(working, T * per.act_output);
  // Swap-attention (MindSpeed --swap-attention): attention activations go to pinned host memory
  // after forward and come back ahead of backward; the prefetch window's layers stay resident.
  if (tech.swap_attention && stored_units > 0) {
    const double resident = std::min<double>(stored_units, double(tech.prefetch_window));
    const double per_unit = attention / stored_units;
    out.host_bytes += to_bytes(per_unit * (stored_units - resident), "swapped activations");
    attention = per_unit * resident;
  }
  // Embedding input (8 B per token) and its dropout mask, for every micro-batch in flight
  // (Megatron-LM theoretical_memory_usage.py).
  double embedding = first ? in_flight * T * (8.0 + (m.dropout ? h / rep : 0.0)) : 0.0;
  // Output layer and loss (Megatron-LM): 4·s·b·h·(1 + V/h) / t — the final norm and output
  // inputs (2h + 2h) and fp32 logits (4V), one micro-batch.
  double logits = last ? T * (4.0 * h / rep + 4.0 * double(vocab) / t) : 0.0;

  out.activations = {{"attention", to_bytes(attention, "attention")},   {"core_attention", to_bytes(core, "core_attention")},
                     {"mlp", to_bytes(mlp, "mlp")},               {"mlp_activation_output", to_bytes(act_out, "mlp_activation_output")},
                     {"moe_router", to_bytes(router, "moe_router")},     {"embedding", to_bytes(embedding, "embedding")},
                     {"output_logits", to_bytes(logits, "output_logits")},  {"recompute_working_set", to_bytes(working, "recompute_working_set")}};

  // Model states: dense parameters shard over DP·CP, experts over the expert-data-parallel group.
  const StageParams sp = stage_params(c, out.layers, first, last, vocab);
  out.parameters = to_bytes(sp.dense + sp.expert, "parameters");
  const double n_dense = double(p.dp * p.cp), n_expert = double(p.dp * p.cp / p.ep);
  const States dense = model_states(c, sp.dense, n_dense, sp.largest_layer);
  const States expert = model_states(c, sp.expert, n_expert, 0.0);
  out.weights = to_bytes(dense.weights + expert.weights, "weights");
  out.gradients = to_bytes(dense.gradients + expert.gradients, "gradients");
  out.optimizer_states = to_bytes(dense.optimizer + expert.optimizer, "optimizer states");
  out.host_bytes += to_bytes(dense.host + expert.host, "host bytes");

  // Communication buffers: the sequence-parallel all-gather of a layer input (2·s·b·h), the
  // pipeline send/receive pair in both directions, the MoE all-to-all send/receive of the routed
  // tokens, and DeepSpeed's reduce/all-gather buckets (reduce_bucket_size, allgather_bucket_size).
  double comm = 0.0;
  if (p.sequence_parallel && p.tp > 1) comm += T * 2.0 * h;
  if (p.pp > 1) comm += 4.0 * T * 2.0 * h / rep;
  if (m.moe() && p.ep > 1) comm += 2.0 * T * double(m.experts_per_token) * 2.0 * h / rep;
  const double W = tr.precision == Precision::fp32 ? 4.0 : 2.0;
  comm += W * double(p.reduce_bucket_elements + p.allgather_bucket_elements);
  out.communication = to_bytes(comm, "communication buffers");

  double total = double(out.model_states()) + double(out.communication);
  for (const auto& a : out.activations) total += double(a.bytes);
  out.peak_allocated = to_bytes(total, "peak allocated");
  // Caching-allocator overhead (reserved − allocated): a fraction of the peak, 5 % by default
  // as in Megatron-LM's report (overhead_factor = 1.05 for temporaries).
  out.allocator_overhead = to_bytes(double(out.peak_allocated) * c.allocator_overhead, "allocator overhead");
  out.peak_reserved = to_bytes(double(out.peak_allocated) + double(out.allocator_overhead), "peak reserved");
  return out;
}

}  // namespace

StageMemory estimate_memory(const RunConfig& config) {
  validate(config);
  const auto& p = config.parallel;
  // Megatron pads the vocabulary to a multiple of make-vocab-size-divisible-by × TP.
  const std::int64_t div = config.training.vocab_divisor * p.tp;
  const std::int64_t vocab = (config.model.vocab_size + div - 1) / div * div;
  if (p.pp == 1) return evaluate_stage(config, true, true, vocab);
  StageMemory first = evaluate_stage(config, true, false, vocab);
  StageMemory last = evaluate_stage(config, false, true, vocab);
  return last.peak_reserved > first.peak_reserved ? last : first;
}

}  // namespace stowage::estimate
