#include "tools/estimate/moe_activations.hpp"

#include <algorithm>

namespace stowage::estimate {

namespace {
// Tokens of the micro-batch that enter the layer on this rank, per token: sequence parallelism
// splits them over TP (Megatron refuses MoE with TP > 1 without it in training, moe_layer.py L636).
double local_fraction(const RunConfig& c) { return c.parallel.sequence_parallel ? 1.0 / double(c.parallel.tp) : 1.0; }
}  // namespace

double routed_tokens_per_token(const RunConfig& c) {
  // Both dispatchers gather the routed tokens over the expert-TP ranks: allgather over ETP·EP
  // (token_dispatcher.py L299-301, then keeps the E/EP local experts' k-of-E share), alltoall sends
  // each token to its k experts over EP and gathers over ETP (L746).
  return double(c.model.experts_per_token) * double(c.parallel.expert_tp()) * local_fraction(c);
}

MoeLayerBytes moe_layer_bytes_per_token(const RunConfig& c) {
  const auto& m = c.model;
  const double h = double(m.hidden_size), F = double(m.expert_ffn()), etp = double(c.parallel.expert_tp());
  const double local = local_fraction(c), routed = routed_tokens_per_token(c);
  const double mask = m.dropout ? 1.0 : 0.0, A = activation_bytes(c);
  const double probs = c.moe.probs_bytes > 0 ? double(c.moe.probs_bytes) : A;
  MoeLayerBytes b;
  // In elements of A bytes: the router's gating GEMM keeps its input, the pre-MLP norm's output
  // (moe_utils.py L1382); each routed copy is the expert fc1's saved input (permute's index_select
  // output, L486); fc1's output (F/ETP per copy, 2F/ETP gated) is the activation's saved input.
  // The MLP dropout mask after the combine, 1 byte per element.
  b.mlp = (A * h + mask * h) * local + routed * A * h + routed * A * F / etp * (m.gated_mlp ? 2 : 1);
  // The routing probability scales the activation's output before fc2 (experts.py L1015,
  // mlp.py L340): the product keeps that output for the probabilities' gradient and fc2 keeps the
  // product; unfused SwiGLU also keeps silu(x1) for the gate's product (experts.py L1007). The
  // fused weighted SwiGLU (experts.py L966) keeps only its input and fc2's.
  const bool fused = m.gated_mlp && c.training.fused_swiglu;
  const double routed_act = routed * A * F / etp * (fused ? 1.0 : m.gated_mlp ? 3.0 : 2.0);
  b.act_output = routed_act;
  // Router probabilities over all experts (the logits' dtype, moe_utils.py L899); per routed copy
  // the int64 index permute sorts by (L475, kept for unpermute) and its probability (kept by the
  // product above; token_dispatcher.py L331).
  b.router = probs * double(m.num_experts) * local + routed * (8 + probs);
  const SharedExpertBytes s = shared_expert_bytes_per_token(c);
  b.mlp += s.mlp;
  b.act_output += s.act_output;

  // Selective recompute (transformer_config.py recompute_modules). The pre-MLP norm is a module of
  // its own in an MoE layer (TENorm), so layernorm releases its output, the router's saved input
  // (transformer_layer.py), recomputed first in the MLP's backward and alive through it.
  const auto& r = c.recompute;
  const double norm_output = A * h * local;
  if (r.recomputes(RecomputeModule::moe)) {
    // moe: the checkpointed layer keeps its input, the norm's output (moe_layer.py), and
    // rematerialises the rest at once in its backward.
    b.rerun = b.mlp - (norm_output + mask * h * local) + b.act_output + b.router;
    b.mlp = norm_output + mask * h * local;
    b.act_output = 0;
    b.router = 0;
  } else {
    // moe_act: the weighted activation keeps fc1's output and the probabilities, its inputs, and
    // releases fc2's input once fc2 has saved it (experts.py); shared_experts: the checkpointed
    // shared MLP keeps its input, the norm's output (moe_layer.py). Each reruns in its own part
    // of the backward.
    double act = 0, shared = 0;
    if (r.recomputes(RecomputeModule::moe_act)) {
      act = routed_act;
      b.act_output -= routed_act;
    }
    if (r.recomputes(RecomputeModule::shared_experts)) {
      shared = s.mlp + s.act_output;
      b.mlp -= s.mlp;
      b.act_output -= s.act_output;
    }
    b.rerun = std::max(act, shared);
  }
  if (r.recomputes(RecomputeModule::layernorm)) {
    b.mlp -= norm_output;
    b.rerun += norm_output;
  }
  return b;
}

SharedExpertBytes shared_expert_bytes_per_token(const RunConfig& c) {
  const auto& m = c.model;
  const auto& p = c.parallel;
  SharedExpertBytes b;
  if (!m.shared_experts()) return b;
  const double h = double(m.hidden_size), S = double(m.shared_expert_ffn_hidden_size), t = double(p.tp);
  const double A = activation_bytes(c);
  // SharedExpertMLP is Megatron's MLP with ffn_hidden_size = S (shared_experts.py), split by TP: fc1's
  // output (2S/t gated) is the activation's saved input, fc2 keeps the activation's output (S/t;
  // unfused SwiGLU also silu(x1)), as a dense MLP of that width. fc1 saves the pre-MLP norm's
  // output, the tensor the router keeps: no new bytes. With --moe-shared-expert-overlap the
  // linears' TP communication is off and pre_forward_comm gathers the sequence-parallel input
  // itself, so fc1 keeps that gathered copy, h per token (no gather at TP 1).
  const bool gathered = c.moe.shared_expert_overlap && p.sequence_parallel && p.tp > 1;
  b.mlp = A * S * (m.gated_mlp ? 2 : 1) / t + (gathered ? A * h : 0.0);
  b.act_output = A * S / t * (m.gated_mlp && !c.training.fused_swiglu ? 2 : 1);
  // --moe-shared-expert-gate: output * sigmoid(linear(x, gate_weight)); the sigmoid keeps its
  // output (1 per token) and the product keeps the shared output (h) and that score.
  if (m.shared_expert_gate) b.mlp += A * (h + 1) * local_fraction(c);
  return b;
}

double moe_dispatch_buffer_bytes(const RunConfig& c, double tokens) {
  const auto& p = c.parallel;
  const double h = double(c.model.hidden_size), local = local_fraction(c);
  if (c.moe.dispatcher == MoeDispatcher::allgather) {
    // The hidden states gathered over ETP·EP land in the global memory buffer (use_global_buffer,
    // token_dispatcher.py L300), allocated once at its largest size and kept (utils.py
    // GlobalMemoryBuffer.get_tensor L735-753). No gather with ETP·EP = 1 (mappings.py L135).
    const double ranks = double(p.expert_tp() * p.ep);
    return ranks > 1 ? tokens * local * ranks * activation_bytes(c) * h : 0.0;
  }
  // All-to-all: the permuted tokens sent and the tokens received, k copies each.
  if (p.ep <= 1) return 0.0;
  return 2.0 * tokens * double(c.model.experts_per_token) * activation_bytes(c) * h * local;
}

}  // namespace stowage::estimate
