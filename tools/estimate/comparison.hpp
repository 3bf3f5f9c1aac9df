#pragma once
// The estimate for a configuration next to the same run without stowage's techniques, with each
// technique alone, and with all of them: what each one saves.
#include <string>
#include <vector>

#include "tools/estimate/memory_model.hpp"

namespace stowage::estimate {

struct Variant {
  std::string name;
  StageMemory memory;
  std::int64_t saving = 0;  // baseline.peak_reserved − memory.peak_reserved
};

struct EstimateResult {
  RunConfig config;
  StageMemory baseline;        // the configuration with every stowage technique off
  StageMemory configured;      // the configuration as given
  std::vector<Variant> alone;  // shared_storage, act_fn_recompute, swap_attention, optimizer_offload
  Variant all;                 // all four together
};

// Techniques not enabled in `config` are tried with their defaults (mapped offload, window 1).
EstimateResult run_estimate(const RunConfig& config);

// `config` with the activation-function granularity folded into the technique flag.
RunConfig normalized(RunConfig config);
RunConfig without_techniques(RunConfig config);
RunConfig with_all_techniques(RunConfig config);

}  // namespace stowage::estimate
