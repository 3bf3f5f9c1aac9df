#pragma once
// Suites run once per device backend (parameterised on DeviceKind): the device an instance runs
// on. The CUDA instance skips first where cuda_device_count() is 0.
#include <memory>

#include "stowage/cuda_device.hpp"
#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"

namespace stowage::testing {

// CUDA device 0, or an emulated device made with `emulated`.
inline std::unique_ptr<Device> make_test_device(DeviceKind kind, const EmulatedOptions& emulated) {
  return kind == DeviceKind::cuda ? make_cuda_device(0) : make_emulated_device(0, emulated);
}

}  // namespace stowage::testing
