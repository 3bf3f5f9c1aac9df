#include "tools/estimate/expert_parallel.hpp"

namespace stowage::estimate {

namespace {
double per_rank(const RunConfig& c, std::int64_t layers, bool biases) {
  const auto& m = c.model;
  const auto& p = c.parallel;
  if (!m.moe()) return 0.0;
  // TEColumnParallelLinear / TERowParallelLinear with is_expert divide fc1's outputs and fc2's
  // inputs by the expert-TP size (extensions/transformer_engine.py L1261-1268); the row-parallel
  // bias stays whole.
  const double h = double(m.hidden_size), F = double(m.expert_ffn()), etp = double(p.expert_tp());
  const double fc1_out = F * (m.gated_mlp ? 2 : 1);
  const bool bias = biases && m.mlp_bias;
  const double split = h * fc1_out + F * h + (bias ? fc1_out : 0.0);
  const double whole = bias ? h : 0.0;
  const double per_expert = split / etp + whole;
  return per_expert * double(m.num_experts) / double(p.ep) * double(layers);  // validate(): EP divides E
}
}  // namespace

double expert_params_per_rank(const RunConfig& c, std::int64_t layers) { return per_rank(c, layers, true); }

double expert_weights_per_rank(const RunConfig& c, std::int64_t layers) { return per_rank(c, layers, false); }

double expert_state_shards(const RunConfig& c) {
  // parallel_state.py: expert_data_parallel_size = world ÷ (ETP·EP·PP) (L874-880), divided by
  // num_distributed_optimizer_instances for the distributed optimizer's shards (L1447-1451).
  const auto& p = c.parallel;
  return double(p.expert_dp()) / double(p.optimizer_instances);
}

}  // namespace stowage::estimate
