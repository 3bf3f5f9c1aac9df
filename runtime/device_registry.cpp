// The process-wide devices: CUDA ones when a GPU is usable and not configured away, else
// emulated ones. Each is opened on first use and lives until the process ends.
#include <atomic>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "common/log.hpp"
#include "stowage/config.hpp"
#include "stowage/runtime.hpp"
#include "stowage/fault_injection.hpp"

namespace stowage {

namespace {

struct Registry {
  bool cuda = false;
  int count = 0;
  EmulatedOptions emulated;
  FaultPlan faults;
  std::unique_ptr<std::atomic<Device*>[]> devices;
  std::mutex mutex;

  Registry() {
    const Config& c = config();  // ParseError propagates; the next call tries again
    const int gpus = c.device == DeviceChoice::emulated ? 0 : cuda_device_count();
    if (c.device == DeviceChoice::cuda && gpus == 0)
      throw Unsupported("STOWAGE_DEVICE=cuda, but no CUDA device is usable: " + cuda_unavailable_reason());
    cuda = gpus > 0;
    count = cuda ? gpus : c.emulated_devices;
    emulated = c.emulated;
    faults = c.faults;
    devices = std::make_unique<std::atomic<Device*>[]>(static_cast<std::size_t>(count));
    log().info("process devices: {} {} device(s)", count, cuda ? "cuda" : "emulated");
    if (faults.any())
      log().warn("STOWAGE_FAULTS: injecting faults on every device (alloc every {}, map every {}, pin every {}, "
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

int device_count() { return registry().count; }
bool using_cuda() { return registry().cuda; }

Device& device(int ordinal) {
  Registry& r = registry();
  if (ordinal < 0 || ordinal >= r.count)
    throw InvalidArgument(fmt::format("device {}: there are {} {} device(s) (ordinals 0 to {})", ordinal, r.count,
                                      r.cuda ? "cuda" : "emulated", r.count - 1));
  auto& slot = r.devices[static_cast<std::size_t>(ordinal)];
  if (Device* d = slot.load(std::memory_order_acquire)) return *d;
  std::lock_guard lock(r.mutex);
  if (Device* d = slot.load(std::memory_order_relaxed)) return *d;
  std::unique_ptr<Device> made = r.cuda ? make_cuda_device(ordinal) : make_emulated_device(ordinal, r.emulated);
  if (r.faults.any()) made = std::make_unique<FaultInjectingDevice>(std::move(made), r.faults);
  slot.store(made.get(), std::memory_order_release);
  return *made.release();
}

}  // namespace stowage
