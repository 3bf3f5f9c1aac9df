// Activation kernel tables by backend: a backend with its own kernels adds its table here.
#include "recompute/device_kernels.hpp"

#include <fmt/format.h>

#include "stowage/error.hpp"

namespace stowage::detail {

const ActivationKernels& activation_kernels(const Device& device) {
  switch (device.kind()) {
    case DeviceKind::emulated: return host_activation_kernels();
    case DeviceKind::cuda: return cuda_activation_kernels();
  }
  throw Unsupported(fmt::format("recompute: no activation kernels for {} devices", to_string(device.kind())));
}

}  // namespace stowage::detail
