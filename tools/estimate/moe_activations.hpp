#pragma once
// What an MoE layer's routed and shared experts keep for backward and the dispatch buffer they leave
// allocated, from Megatron-LM's token dispatchers, experts and router (megatron/core/transformer/
// moe/, d98e8a6). The sources are cited beside each term in moe_activations.cpp.
#include "tools/estimate/run_config.hpp"

namespace stowage::estimate {

// Bytes per token of the micro-batch (s·b/cp) of one MoE layer on one rank, in the memory
// model's kinds: `mlp` (norm output kept by the router, expert fc1 inputs, the activation's input,
// the dropout mask), `act_output` (what the activation and the probability scaling keep before
// fc2), `router` (probabilities, the permutation's indices and the permuted probabilities).
// Selective recompute's modules (RecomputeModule) take what they rematerialise out of these;
// `rerun` is the most of it alive at once in the layer's MLP backward.
struct MoeLayerBytes {
  double mlp = 0, act_output = 0, router = 0, rerun = 0;
};
MoeLayerBytes moe_layer_bytes_per_token(const RunConfig& c);

// Of those, the shared experts' (included above): the activation's input and, with the overlapped
// path under sequence parallelism, fc1's gathered input (`mlp`), fc2's input (`act_output`), and
// with the gate its sigmoid output and the shared output it scales (`mlp`).
struct SharedExpertBytes {
  double mlp = 0, act_output = 0;
};
SharedExpertBytes shared_expert_bytes_per_token(const RunConfig& c);

// Routed tokens an expert rank processes per token of its micro-batch, with balanced routing:
// each of its T/tp (sequence-parallel) tokens is gathered over the ETP·EP ranks and k of the E
// experts take it, E/EP of them here: k·ETP/tp.
double routed_tokens_per_token(const RunConfig& c);

// Dispatch buffers alive at the peak for `tokens` tokens of a micro-batch: the all-gather
// dispatcher's gathered hidden states in Megatron's global memory buffer (kept between layers and
// steps), or the all-to-all's send and receive copies of the routed tokens.
double moe_dispatch_buffer_bytes(const RunConfig& c, double tokens);

}  // namespace stowage::estimate
