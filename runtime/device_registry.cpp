// The process-wide devices, from the backend the configuration chooses (stowage/runtime.hpp).
// Each is opened on first use and lives until the process ends.
#include <atomic>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "common/fork_generation.hpp"
#include "common/log.hpp"
#include "runtime/devices_forked.hpp"
#include "stowage/backends.hpp"
#include "stowage/config.hpp"
#include "stowage/fault_injection.hpp"
#include "stowage/runtime.hpp"

namespace stowage {

namespace {

// The backend STOWAGE_DEVICE names; for "auto" the first accelerator backend with a device, else
// the emulated one.
const Backend& chosen_backend(const Config& c) {
  if (c.device != "auto") {
    const Backend* b = find_backend(c.device);  // config validated the name
    if (b->accelerator && b->device_count() == 0)
      throw Unsupported(
          fmt::format("STOWAGE_DEVICE={}, but no {} device is usable: {}", c.device, b->name, b->unavailable_reason()));
    return *b;
  }
  for (const Backend& b : backends())
    if (b.accelerator && b.device_count() > 0) return b;
  return backend_of(DeviceKind::emulated);
}

struct Registry {
  unsigned generation = fork_generation();  // the process that opened the devices
  const Backend* backend = nullptr;
  int count = 0;
  BackendOptions options;
  FaultPlan faults;
  std::unique_ptr<std::atomic<Device*>[]> devices;
  std::mutex mutex;

  Registry() {
    const Config& c = config();  // ParseError propagates; the next call tries again
    backend = &chosen_backend(c);
    count = backend->accelerator ? backend->device_count() : c.emulated_devices;
    options.emulated = c.emulated;
    faults = c.faults;
    devices = std::make_unique<std::atomic<Device*>[]>(static_cast<std::size_t>(count));
    log().info("process devices: {} {} device(s)", count, backend->name);
    if (faults.any())
      log().warn(
          "STOWAGE_FAULTS: injecting faults on every device (alloc every {}, map every {}, pin every {}, "
          "copy every {}; 0 = never)",
          faults.allocation_every, faults.map_every, faults.pin_every, faults.copy_every);
  }
};

Registry& registry() {
  // Leaked on purpose: allocators and frameworks may still use devices during static destruction.
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

void refuse_if_devices_forked(std::string_view what) {
  if (forked_since(registry().generation)) refuse_in_forked_child(what);
}

int device_count() { return registry().count; }
DeviceKind device_kind() { return registry().backend->kind; }
bool using_cuda() { return device_kind() == DeviceKind::cuda; }

Device& device(int ordinal) {
  Registry& r = registry();
  if (ordinal < 0 || ordinal >= r.count)
    throw InvalidArgument(fmt::format("device {}: there are {} {} device(s) (ordinals 0 to {})", ordinal, r.count,
                                      r.backend->name, r.count - 1));
  auto& slot = r.devices[static_cast<std::size_t>(ordinal)];
  if (Device* d = slot.load(std::memory_order_acquire)) return *d;  // a parent's refuses by itself
  refuse_if_devices_forked(fmt::format("stowage: opening device {}", ordinal));
  std::lock_guard lock(r.mutex);
  if (Device* d = slot.load(std::memory_order_relaxed)) return *d;
  std::unique_ptr<Device> made = r.backend->open(ordinal, r.options);
  if (r.faults.any()) made = std::make_unique<FaultInjectingDevice>(std::move(made), r.faults);
  slot.store(made.get(), std::memory_order_release);
  return *made.release();
}

}  // namespace stowage
