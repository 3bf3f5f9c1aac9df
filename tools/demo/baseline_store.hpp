#pragma once
// The baseline placements: an fp32 master plus a separate bf16 copy (6 B per parameter), and
// AdamW states m, v on the device (8 B per parameter).
#include <memory>
#include <vector>

#include "tools/demo/hooks.hpp"

namespace stowage::demo {

std::unique_ptr<ParameterStore> make_separate_copy_store(const Context& ctx, const std::vector<float>& init);
std::unique_ptr<OptimizerStates> make_device_states(const Context& ctx, std::int64_t n);

}  // namespace stowage::demo
