// Precision kernel tables by backend: a backend with its own kernels adds its table here.
#include "precision/device_kernels.hpp"

#include <fmt/format.h>

#include "stowage/error.hpp"

namespace stowage::detail {

const DeviceKernels& device_kernels(const Device& device) {
  switch (device.kind()) {
    case DeviceKind::emulated: return host_device_kernels();
    case DeviceKind::cuda: return cuda_device_kernels();
  }
  throw Unsupported(fmt::format("precision: no kernels for {} devices", to_string(device.kind())));
}

}  // namespace stowage::detail
