#pragma once
// The saving `stowage estimate` predicts for a demo configuration: its memory model
// (tools/estimate/) run on the demo's model shape with and without the configuration's
// techniques. It counts activations as bf16 (2 B) where the demo keeps them in fp32, so for
// activation techniques it is a lower bound on the demo's saving; for optimizer offload it
// counts the fp32 master as offloaded too (12 B/param) where stowage::OffloadedAdam moves m and
// v only (8 B/param).
#include <cstdint>

#include "tools/demo/configurations.hpp"
#include "tools/demo/model.hpp"

namespace stowage::demo {

// shape.vocab must be set. Peak allocated bytes, baseline minus with the techniques.
std::int64_t estimated_saving(const Techniques& t, const ModelShape& shape, Rounding rounding);

}  // namespace stowage::demo
