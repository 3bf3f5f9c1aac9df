#pragma once
// How expert parallelism splits and shards an MoE's experts: weights split by expert-tensor
// parallelism (ETP) and expert parallelism (EP), their optimizer states sharded over the
// expert-data-parallel ranks (MoE parallel folding, Megatron-LM parallel_state.py).
#include <cstdint>

#include "tools/estimate/run_config.hpp"

namespace stowage::estimate {

// Expert parameters one rank holds for `layers` MoE layers: each expert's fc1 split by columns
// and fc2 by rows over ETP, fc2's bias whole on every ETP rank; E/EP experts per rank.
double expert_params_per_rank(const RunConfig& c, std::int64_t layers);
// The same without the biases: the experts' 2-D weights.
double expert_weights_per_rank(const RunConfig& c, std::int64_t layers);

// Ranks the distributed optimizer shards the experts' states over: the expert-data-parallel
// group, split into --num-distributed-optimizer-instances replicas as the dense part is.
double expert_state_shards(const RunConfig& c);

}  // namespace stowage::estimate
