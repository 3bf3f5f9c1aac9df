// The C ABI: one process-wide CachingAllocator per device, made on first use. Every entry point
// catches everything, so no C++ exception crosses into a C or Python caller.
#include "stowage/runtime.hpp"
#include "stowage/stowage.h"

#include <atomic>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "common/log.hpp"
#include "stowage/allocator.hpp"
#include "stowage/config.hpp"
#include "stowage/event_log.hpp"
#include "stowage/logging_resource.hpp"

namespace stowage {
namespace {

thread_local std::string last_error;

// A device's resources: the caching allocator, and what callers allocate through (the caching
// allocator itself, or a LoggingResource over it when STOWAGE_EVENT_LOG names a file).
struct DeviceAllocator {
  std::shared_ptr<CachingAllocator> allocator;
  std::shared_ptr<MemoryResource> top;
};

struct Allocators {
  int count = 0;
  std::unique_ptr<std::atomic<DeviceAllocator*>[]> slots;
  std::shared_ptr<EventLog> event_log;
  std::mutex mutex;

  Allocators() {
    count = device_count();  // reads the configuration; ParseError propagates
    slots = std::make_unique<std::atomic<DeviceAllocator*>[]>(static_cast<std::size_t>(count));
  }

  DeviceAllocator* created(int ordinal) const {
    return ordinal >= 0 && ordinal < count ? slots[static_cast<std::size_t>(ordinal)].load(std::memory_order_acquire)
                                           : nullptr;
  }

  DeviceAllocator& get(int ordinal) {
    if (ordinal < 0 || ordinal >= count)
      throw InvalidArgument(fmt::format("device {}: there are {} device(s) (ordinals 0 to {})", ordinal, count, count - 1));
    if (DeviceAllocator* a = created(ordinal)) return *a;
    std::lock_guard lock(mutex);
    auto& slot = slots[static_cast<std::size_t>(ordinal)];
    if (DeviceAllocator* a = slot.load(std::memory_order_relaxed)) return *a;
    const Config& c = config();
    auto made = std::make_unique<DeviceAllocator>();
    made->allocator = std::make_shared<CachingAllocator>(device(ordinal), c.allocator);
    made->top = made->allocator;
    if (!c.event_log.empty()) {
      if (!event_log) event_log = std::make_shared<EventLog>(c.event_log);
      made->top = std::make_shared<LoggingResource>(made->allocator, event_log);
    }
    log().info("C ABI: caching allocator for device {} ({})", ordinal, device(ordinal).name());
    slot.store(made.get(), std::memory_order_release);
    return *made.release();
  }
};

Allocators& allocators() {
  // Leaked on purpose: frameworks free tensors during their own static destruction.
  static Allocators* a = new Allocators();
  return *a;
}

// Runs f, turning any exception into `on_error` plus the thread's last error.
template <class R, class F>
R guarded(R on_error, F&& f) noexcept {
  try {
    last_error.clear();
    return f();
  } catch (const std::exception& e) {
    try {
      last_error = e.what();
    } catch (...) {
    }
  } catch (...) {
    last_error = "unknown error";
  }
  return on_error;
}

std::size_t checked_size(ssize_t size, const char* what) {
  if (size < 0) throw InvalidArgument(fmt::format("{}: negative size {}", what, static_cast<long long>(size)));
  return static_cast<std::size_t>(size);
}

}  // namespace
}  // namespace stowage

using namespace stowage;

extern "C" {

void* stowage_malloc(ssize_t size, int device, void* stream) {
  return guarded<void*>(nullptr, [&]() -> void* {
    const std::size_t bytes = checked_size(size, "stowage_malloc");
    return allocators().get(device).top->allocate(bytes, stream_from_native(stream));
  });
}

void stowage_free(void* ptr, ssize_t size, int device, void* stream) {
  guarded<int>(0, [&] {
    if (ptr == nullptr) return 0;
    const std::size_t bytes = checked_size(size, "stowage_free");
    Allocators& all = allocators();
    DeviceAllocator& a = all.get(device);
    if (!a.allocator->owns(ptr)) {
      for (int other = 0; other < all.count; ++other)
        if (DeviceAllocator* o = all.created(other); other != device && o != nullptr && o->allocator->owns(ptr))
          throw InvalidArgument(fmt::format("stowage_free: {} belongs to device {}, not device {}", ptr, other, device));
    }
    a.top->deallocate(ptr, bytes);  // InvalidArgument for foreign pointers, double frees, wrong sizes
    return 0;
  });
}

int stowage_empty_cache(int device) {
  return guarded(-1, [&] {
    allocators().get(device).allocator->empty_cache();
    return 0;
  });
}

int stowage_record_stream(void* ptr, int device, void* stream) {
  return guarded(-1, [&] {
    if (ptr == nullptr) throw InvalidArgument("stowage_record_stream: null pointer");
    allocators().get(device).top->record_stream(ptr, stream_from_native(stream));
    return 0;
  });
}

ssize_t stowage_get_stats(int device, char* buf, size_t len) {
  return guarded<ssize_t>(-1, [&]() -> ssize_t {
    if (buf == nullptr && len != 0) throw InvalidArgument("stowage_get_stats: null buffer of non-zero length");
    const std::string json = to_json(allocators().get(device).allocator->stats());
    if (len > 0) {
      const std::size_t n = std::min(len - 1, json.size());
      json.copy(buf, n);
      buf[n] = '\0';
    }
    return static_cast<ssize_t>(json.size());
  });
}

int stowage_reset_peak_stats(int device) {
  return guarded(-1, [&] {
    allocators().get(device).allocator->reset_peak_stats();
    return 0;
  });
}

int stowage_snapshot(int device, const char* path) {
  return guarded(-1, [&] {
    if (path == nullptr || *path == '\0') throw InvalidArgument("stowage_snapshot: no path");
    const std::string json = to_json(allocators().get(device).allocator->snapshot());
    std::ofstream out(path, std::ios::trunc);
    if (!out) throw InvalidArgument(fmt::format("stowage_snapshot: cannot open '{}' for writing", path));
    out << json;
    out.close();
    if (!out) throw Error(fmt::format("stowage_snapshot: writing '{}' failed", path));
    return 0;
  });
}

int stowage_set_memory_cap(int device, size_t bytes) {
  return guarded(-1, [&] {
    allocators().get(device).allocator->set_memory_cap(bytes);
    return 0;
  });
}

int stowage_device_count(void) {
  return guarded(-1, [] { return allocators().count; });
}

int stowage_using_cuda(void) {
  return guarded(-1, [] { return using_cuda() ? 1 : 0; });
}

const char* stowage_last_error(void) { return last_error.c_str(); }

}  // extern "C"
