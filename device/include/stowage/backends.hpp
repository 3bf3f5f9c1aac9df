#pragma once
// The device backends of this build, each a folder under device/ (device/emulated/,
// device/cuda/) registered by one line in device/backends.cpp. The runtime opens its devices
// from the first backend that has any, by name (STOWAGE_DEVICE) or in order of preference;
// nothing else above the device layer asks which backend it has (docs/backends.md).
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"

namespace stowage {

// What opening a device may need; each backend reads its own part.
struct BackendOptions {
  EmulatedOptions emulated;
};

struct Backend {
  DeviceKind kind;
  const char* name;  // as STOWAGE_DEVICE spells it
  // Real accelerator memory. The emulated backend is not: it is the fallback when no accelerator
  // backend has a device, and it has as many devices as it is asked for.
  bool accelerator;
  int (*device_count)();                // usable now; 0 when none
  std::string (*unavailable_reason)();  // why device_count() is 0
  std::unique_ptr<Device> (*open)(int ordinal, const BackendOptions& options);
};

// Every backend of this build, accelerators first in order of preference, the emulated one last.
std::span<const Backend> backends();
// The backend of that name or kind; nullptr when this build has none.
const Backend* find_backend(std::string_view name);
const Backend& backend_of(DeviceKind kind);
// "cuda, emulated": the names, for messages.
std::string backend_names();

}  // namespace stowage
