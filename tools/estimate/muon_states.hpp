#pragma once
// Model states under Megatron-LM's Muon (--optimizer muon): the 2-D weights it orthogonalises
// keep one momentum, the rest (embedding, output layer, norms, biases) the scalar optimizer's.
#include <cstdint>

#include "tools/estimate/model_states.hpp"

namespace stowage::estimate {

// The 2-D weights Muon manages among a pipeline stage's parameters on one rank: attention and MLP
// (or router and expert) weights and learned position embeddings; not the word embedding or the
// output layer (is_embedding_or_output_parameter). `experts` selects the expert weights alone.
// The stage holds `moe_layers` MoE layers and `dense_layers` dense ones (all dense in a dense model).
double muon_matrix_params(const RunConfig& c, std::int64_t moe_layers, std::int64_t dense_layers, bool first,
                          bool experts);

// model_states() for `params` parameters of which `matrix` are Muon's (all of them Adam's or
// SGD's for the other optimizers).
States stage_states(const RunConfig& c, double params, double matrix, double n, double largest_layer);

}  // namespace stowage::estimate
