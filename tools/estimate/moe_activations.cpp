#include "tools/estimate/moe_activations.hpp"

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
  b.act_output = routed * A * F / etp * (fused ? 1.0 : m.gated_mlp ? 3.0 : 2.0);
  // Router probabilities over all experts (the logits' dtype, moe_utils.py L899); per routed copy
  // the int64 index permute sorts by (L475, kept for unpermute) and its probability (kept by the
  // product above; token_dispatcher.py L331).
  b.router = probs * double(m.num_experts) * local + routed * (8 + probs);
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
