#pragma once
// Megatron-LM's recompute arguments as a launch line spells them (--recompute-granularity,
// --recompute-activations, --recompute-method, --recompute-num-layers, --recompute-modules),
// checked as Megatron-LM checks the combination once parsed (arguments.py, TransformerConfig).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tools/estimate/run_config.hpp"

namespace stowage::estimate {

struct LineRecompute {
  bool activations = false;  // --recompute-activations
  std::optional<Recompute> granularity;
  std::optional<RecomputeMethod> method;
  std::optional<std::int64_t> num_layers;
  std::optional<std::vector<std::string>> modules;  // --recompute-modules, one or more names
};

// Sets c.recompute from the line; the model (MLA, shared experts and their overlap) is already
// in c, and `grouped_gemm` is --moe-grouped-gemm, which moe_act needs. InvalidArgument where
// Megatron-LM refuses the line.
void apply_recompute(const LineRecompute& r, bool grouped_gemm, RunConfig& c);

}  // namespace stowage::estimate
