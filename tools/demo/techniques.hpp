#pragma once
// Factories for the technique versions of the trainer's hooks, one file each
// (technique_<name>.cpp), each a thin adaptor over the stowage API that implements it.
#include <cstdint>
#include <memory>
#include <vector>

#include "stowage/optimizers.hpp"
#include "stowage/precision.hpp"
#include "tools/demo/hooks.hpp"

namespace stowage::demo {

// Shared storage (stowage/precision.hpp): the fp32 master split in place into a bf16 plane
// that forward/backward read and a residual plane (+ a tie bitmap in nearest_even mode);
// AdamW runs fused on the planes (stowage/optimizers.hpp).
std::unique_ptr<ParameterStore> make_shared_storage_store(const Context& ctx, const std::vector<float>& init,
                                                          const AdamOptions& options, Rounding rounding);

}  // namespace stowage::demo
