#pragma once
// Weights, gradients and optimizer states of one device: the ZeRO paper's, Megatron-LM's and
// DeepSpeed's bookkeeping, stowage's optimizer offload and shared storage.
#include "tools/estimate/run_config.hpp"

namespace stowage::estimate {

struct States {
  double weights = 0, gradients = 0, optimizer = 0, host = 0;
  // Allocated inside the optimizer step only, after backward has freed the activations
  // (DeepSpeed ZeRO-1/2's fp32 gradient partition).
  double step_only = 0;
};

// Model states for `params` parameters sharded over `n` ranks; `largest_layer` is the largest
// single module on this device (ZeRO-3 gathers one at a time).
States model_states(const RunConfig& c, double params, double n, double largest_layer);

}  // namespace stowage::estimate
