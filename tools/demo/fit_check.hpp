#pragma once
// Before the demo builds anything: does the model fit the device and the host at all? A model
// that cannot fit is refused at once with the sizes, instead of filling host memory first.
#include <cstdint>

#include "stowage/device.hpp"
#include "tools/demo/model.hpp"

namespace stowage::demo {

struct FitFloor {
  double parameters = 0;    // of the model as make_layout lays it out (before alignment padding)
  double device_bytes = 0;  // the least any configuration keeps on the device
  double host_bytes = 0;    // the least the demo holds on the host (initial parameters)
};

// In doubles, so no shape overflows. Device: fp32 weights and their gradients (8 B/parameter,
// which every configuration keeps there) and one fp32 layer input per layer for backward.
// Host: the fp32 initial parameters every configuration starts from.
FitFloor fit_floor(const ModelShape& shape);

// InvalidArgument naming the shape, the floor and what is available when the floor exceeds the
// device's capacity or the host's available memory; also when a size would overflow the
// kernels' int indexing.
void check_fits(const ModelShape& shape, const Device& device);

// The host's available memory (offload::host_memory_available), bytes.
double host_available_bytes();

}  // namespace stowage::demo
