#include "tools/estimate/muon_states.hpp"

#include "tools/estimate/expert_parallel.hpp"

namespace stowage::estimate {

double muon_matrix_params(const RunConfig& c, std::int64_t moe_layers, std::int64_t dense_layers, bool first,
                          bool experts) {
  const auto& m = c.model;
  if (experts) return expert_weights_per_rank(c, moe_layers);  // their biases go to the scalar optimizer
  const double h = double(m.hidden_size), t = double(c.parallel.tp);
  const double q = double(m.num_heads * m.head_size()), kv = double(m.kv_heads() * m.head_size());
  double attention = (h * q + 2 * h * kv + q * h) / t;
  if (m.mla) {  // every MLA projection is 2-D; the down projections are whole on each TP rank
    const ParameterCounts pc = count_parameters(m, m.vocab_size);
    const double bias = m.proj_bias ? h : 0.0, replicated = double(pc.attention_replicated);
    attention = (double(pc.attention) - bias - replicated) / t + replicated;
  }
  const double F = double(m.ffn_hidden_size);
  // An MoE layer's dense part is its router (replicated); a dense layer's is its MLP.
  // Shared experts' fc1 and fc2 are split by TP; their gate weight (1, h) is 2-D too.
  const double S = double(m.shared_experts() ? m.shared_expert_ffn_hidden_size : 0);
  const double shared =
      double(m.mlp_weights(std::int64_t(S))) / t + (m.shared_experts() && m.shared_expert_gate ? h : 0.0);
  const double moe_mlp = double(m.num_experts) * h + shared, dense_mlp = double(m.mlp_weights(std::int64_t(F))) / t;
  return attention * double(moe_layers + dense_layers) + moe_mlp * double(moe_layers) +
         dense_mlp * double(dense_layers) + (first ? double(m.learned_positions) * h : 0.0);
}

States stage_states(const RunConfig& c, double params, double matrix, double n, double largest_layer) {
  if (c.training.optimizer != Optimizer::muon) return model_states(c, params, n, largest_layer);
  // emerging_optimizers.py: TensorParallelMuon keeps a momentum per managed weight (model_states
  // counts one moment for any optimizer but Adam); _is_muon_excluded routes the embedding, output
  // layer and non-2-D parameters to --muon-scalar-optimizer (Adam by default, or Lion's one moment).
  RunConfig scalar = c;
  scalar.training.optimizer = c.training.muon_scalar;
  const States a = model_states(c, matrix, n, 0.0), b = model_states(scalar, params - matrix, n, largest_layer);
  States s;
  s.weights = a.weights + b.weights;
  s.gradients = a.gradients + b.gradients;
  s.optimizer = a.optimizer + b.optimizer;
  s.host = a.host + b.host;
  s.step_only = a.step_only + b.step_only;
  return s;
}

}  // namespace stowage::estimate
