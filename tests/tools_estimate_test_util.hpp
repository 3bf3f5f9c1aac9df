#pragma once
// Helpers for the estimate's tests: a preset's run configuration, a model's parameter count and
// input files written where the build keeps its scratch files; the command itself through tools_cli_test_util.hpp.
#include <cstdint>
#include <fstream>
#include <string>

#include "tools/estimate/model_config.hpp"
#include "tools/estimate/run_config.hpp"
#include "tools_cli_test_util.hpp"

namespace stowage::testing {

// A preset model with no allocator overhead, so expectations are the model's bytes alone.
inline estimate::RunConfig config_for(const std::string& name) {
  estimate::RunConfig c;
  c.model = estimate::preset(name);
  c.allocator_overhead = 0.0;
  return c;
}

// The model's parameters, its vocabulary's embedding and output layer included.
inline std::int64_t total_params(const estimate::ModelConfig& m) {
  return estimate::count_parameters(m, m.vocab_size).total();
}

// Writes `text` to a file in the build folder and returns its path.
inline std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = std::string(STOWAGE_BINARY_DIR) + "/tools_estimate_test_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

}  // namespace stowage::testing
