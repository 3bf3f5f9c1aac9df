#pragma once
// Runs the demo's configurations one after another, each with a fresh allocator on the same
// device and the same data and initial weights, and measures what each one costs.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "stowage/device.hpp"
#include "stowage/precision.hpp"
#include "tools/demo/configurations.hpp"
#include "tools/demo/model.hpp"

namespace stowage::demo {

struct DemoOptions {
  ModelShape shape;
  int steps = 60;
  std::vector<Configuration> configs;
  Rounding rounding = Rounding::nearest_even;
  std::size_t corpus_bytes = 32 * 1024;
  Device* device = nullptr;  // nullptr: the default device (an emulated one; see demo_device())
};

struct ConfigResult {
  std::string name, summary;
  Techniques techniques;
  std::vector<std::string> details;  // what each hook in use did (from its describe())
  std::vector<float> losses;         // one per step
  std::int64_t peak_allocated = 0;   // allocator stats, bytes, over the whole run
  std::int64_t peak_reserved = 0;
  std::int64_t peak_requested = 0;  // bytes as asked, before the allocator rounds block sizes
  std::uint64_t master_hash = 0;    // FNV-1a of the final fp32 master's bit patterns
  std::int64_t left_allocated = 0;  // still allocated once the run's objects are gone (0 = no leak)
  std::int64_t params = 0;          // parameter elements (with alignment padding)
  int vocab = 0;
  bool must_match = true;      // false where the rounding differs by design (half_up)
  double mean_step_ms = 0;     // steps 2..n (the first warms the cache)
  bool compared = false;       // a baseline ran to compare with
  bool bit_identical = false;  // every step's loss has the baseline's bit pattern
  int first_difference = -1;   // step index (0-based) of the first differing loss
};

// Called after every step: configuration index, step (1-based), loss.
using Progress = std::function<void(std::size_t config, int step, float loss, const ConfigResult& so_far)>;

// The device the demo trains on when none is given: the process default device when it is the
// emulated one (the CPU kernels need host-addressable memory), else a private emulated device.
Device& demo_device(std::string* note = nullptr);

std::vector<ConfigResult> run_demo(const DemoOptions& options, const Progress& progress = {});

}  // namespace stowage::demo
