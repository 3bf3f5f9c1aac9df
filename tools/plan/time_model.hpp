#pragma once
// The modelled time of one training step (one global batch) for a configuration on a cluster:
// compute at the cluster's efficiency, TP/SP/CP collectives, the pipeline bubble (1F1B and
// interleaved), the DP gradient reduce overlapped with backward, swap and offload transfers
// hidden or exposed on their links, and recompute's extra work. The formulas and sources are in
// time_model.cpp and docs/plan.md.
#include "tools/estimate/memory_model.hpp"
#include "tools/plan/cluster.hpp"

namespace stowage::plan {

struct StepTime {
  double compute = 0;    // forward + backward of the model FLOPs, slowest stage, all micro-batches
  double recompute = 0;  // rematerialisation (full / selective / activation function)
  double tp_comm = 0;    // tensor/sequence-parallel collectives (on the critical path)
  double cp_comm = 0;    // context-parallel KV exchange not hidden under attention
  double ep_comm = 0;    // expert-parallel all-to-all (token dispatch and combine)
  double pp_bubble = 0;  // pipeline fill and drain
  double pp_comm = 0;    // pipeline sends and receives on the critical path
  double dp_comm = 0;    // data-parallel reduce / gather not hidden under backward / forward
  double swap = 0;       // swap-attention transfers not hidden under compute
  double optimizer = 0;  // optimizer step (HBM-bound, or over the host link when offloaded)
  double total() const {
    return compute + recompute + tp_comm + cp_comm + ep_comm + pp_bubble + pp_comm + dp_comm + swap + optimizer;
  }
};

// Model FLOPs of one step (forward and backward, no recompute), as Megatron-LM counts them
// (training.py num_floating_point_operations: 6 FLOPs per parameter of every GEMM per token,
// causal attention halved, the output layer included).
double model_flops_per_step(const estimate::RunConfig& c);

// `memory` is the estimate of the same configuration (its swapped bytes feed the swap time).
StepTime step_time(const estimate::RunConfig& c, const Cluster& cluster, const estimate::StageMemory& memory);

}  // namespace stowage::plan
