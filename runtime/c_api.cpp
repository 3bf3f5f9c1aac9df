// The C ABI: one process-wide CachingAllocator per device, made on first use. Every entry point
// catches everything, so no C++ exception crosses into a C or Python caller.
#include "stowage/runtime.hpp"
#include "stowage/stowage.h"

#include "runtime/c_api_buffers.hpp"
#include "runtime/c_api_devices.hpp"
#include "runtime/c_api_guard.hpp"
#include "runtime/devices_forked.hpp"

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include <dlpack/dlpack.h>

#include <fmt/format.h>

#include "common/fork_generation.hpp"
#include "common/log.hpp"
#include "common/thread_exit_key.hpp"
#include "stowage/allocator.hpp"
#include "stowage/config.hpp"
#include "stowage/dlpack.hpp"
#include "stowage/event_log.hpp"
#include "stowage/logging_resource.hpp"

namespace stowage {
namespace {

// The message is written only on failure: a call that succeeds touches the code alone (a plain
// int, no thread-local constructor to run), and stowage_last_error() reads "" while it is OK.
thread_local int last_error_code = STOWAGE_OK;
// The process (fork_generation() + 1) whose first failure reached stderr, 0 before any: a forked
// child's first failure is its own first, and the child is where a refusal most needs saying.
std::atomic<unsigned> first_error_said_in{0};

// What a thread keeps between calls: its last error's message and the tags it pushed.
struct ThreadState {
  std::string last_error;
  std::vector<std::unique_ptr<ScopedTag>> tags;  // stowage_push_tag's, innermost last
};

// A thread's state is ended by a pthread key's destructor (common/thread_exit_key.hpp), which
// runs after every C++ thread_local destructor: a client's thread-local destructor still finds it
// whole, and state first made by a client's own key destructor is ended too, in the next round (a
// thread_local made that late was never destroyed). Calls after it ended, from a key destructor
// later in the same or a later round, find `exited`; their error message is kept, cut short, in
// a buffer. (Setting the key again to outlive every round would leak state made in round 2 or
// later: no destructor can tell which round glibc is in.) The memo has no destructor.
struct ThreadMemo {
  ThreadState* state;
  bool exited;
  char exit_message[256];
};
thread_local ThreadMemo thread_memo{};

void end_thread_state(void* state);

pthread_key_t thread_state_key() {
  static const pthread_key_t key = make_thread_exit_key(end_thread_state);
  return key;
}

void end_thread_state(void* state) {
  auto* s = static_cast<ThreadState*>(state);
  thread_memo.state = nullptr;
  thread_memo.exited = true;
  std::snprintf(thread_memo.exit_message, sizeof thread_memo.exit_message, "%s", s->last_error.c_str());
  while (!s->tags.empty()) s->tags.pop_back();  // innermost first, as they were pushed
  delete s;
}

// This thread's state, made on first use; nullptr once it has ended.
ThreadState* thread_state() {
  ThreadMemo& memo = thread_memo;
  if (memo.state != nullptr || memo.exited) return memo.state;
  auto made = std::make_unique<ThreadState>();
  if (pthread_setspecific(thread_state_key(), made.get()) != 0) throw std::bad_alloc();
  memo.state = made.release();
  return memo.state;
}

// The thread's state for a tag call; InvalidArgument naming `what` once it is gone.
ThreadState& tag_state(const char* what) {
  ThreadState* state = thread_state();
  if (state == nullptr)
    throw InvalidArgument(fmt::format(
        "{}: this thread's tags are gone (called at thread exit after stowage ended the thread's state)", what));
  return *state;
}

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

  // Inlined on every call; making one is out of line.
  DeviceAllocator& get(int ordinal) {
    if (DeviceAllocator* a = created(ordinal)) [[likely]]
      return *a;
    return make(ordinal);
  }

  [[gnu::noinline]] DeviceAllocator& make(int ordinal) {
    if (ordinal < 0 || ordinal >= count)
      throw InvalidArgument(
          fmt::format("device {}: there are {} device(s) (ordinals 0 to {})", ordinal, count, count - 1));
    // In a forked child the mutex may be held for ever by a parent's thread, and the devices are
    // the parent's: no allocator is made there (one the parent made refuses by itself).
    refuse_if_devices_forked(fmt::format("stowage: the C ABI's allocator of device {}", ordinal));
    std::lock_guard lock(mutex);
    auto& slot = slots[static_cast<std::size_t>(ordinal)];
    if (DeviceAllocator* a = slot.load(std::memory_order_relaxed)) return *a;
    const Config& c = config();
    auto made = std::make_unique<DeviceAllocator>();
    made->allocator = std::make_shared<CachingAllocator>(device(ordinal), c.allocator);
    made->top = made->allocator;
    if (!c.event_log.empty()) {
      if (!event_log) {
        try {
          event_log = std::make_shared<EventLog>(c.event_log);
        } catch (const InvalidArgument& e) {  // a file that cannot be made or opened: the setting's fault
          throw ParseError(fmt::format("STOWAGE_EVENT_LOG: {}", e.what()));
        }
      }
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

}  // namespace

namespace capi {

void clear_error() noexcept { last_error_code = STOWAGE_OK; }

int code_of(const std::exception& e) {
  if (dynamic_cast<const OutOfMemory*>(&e) != nullptr) return STOWAGE_ERROR_OUT_OF_MEMORY;
  if (dynamic_cast<const InvalidArgument*>(&e) != nullptr) return STOWAGE_ERROR_INVALID_ARGUMENT;
  if (dynamic_cast<const ParseError*>(&e) != nullptr) return STOWAGE_ERROR_CONFIG;
  if (dynamic_cast<const Unsupported*>(&e) != nullptr) return STOWAGE_ERROR_UNSUPPORTED;
  if (dynamic_cast<const DeviceError*>(&e) != nullptr) return STOWAGE_ERROR_DEVICE;
  return STOWAGE_ERROR_OTHER;
}

void fail(const char* message, int code) noexcept {
  try {
    if (ThreadState* state = thread_state()) {
      state->last_error = message;
    } else {
      std::snprintf(thread_memo.exit_message, sizeof thread_memo.exit_message, "%s", message);
    }
  } catch (...) {
  }
  last_error_code = code;
  // Frameworks often drop a NULL without reading stowage_last_error(): the first failure of the
  // process reaches stderr whatever the log level.
  if (const unsigned process = fork_generation() + 1; first_error_said_in.exchange(process) != process) {
    const bool named = std::string_view(message).starts_with("stowage");
    std::fprintf(stderr, "%s%s (the first error of this process; stowage_last_error() has each one)\n",
                 named ? "" : "stowage: ", message);
  }
}

MemoryResource& allocator_of(int device) { return *allocators().get(device).top; }

}  // namespace capi

namespace {
using capi::check_buffer;
using capi::checked_size;
using capi::copy_out;
using capi::guarded;

// The device whose allocator gave `ptr` out, or -1 (off the hot path: after a refusal).
int owner_of(Allocators& all, const void* ptr) {
  for (int d = 0; d < all.count; ++d)
    if (DeviceAllocator* a = all.created(d); a != nullptr && a->allocator->owns(ptr)) return d;
  return -1;
}

// `device`, or for -1 the device whose allocator owns `ptr` (InvalidArgument naming `what` when none does).
int named_or_owner(Allocators& all, const void* ptr, int device, const char* what) {
  if (device != -1) return device;
  const int owner = owner_of(all, ptr);
  if (owner == -1) throw InvalidArgument(fmt::format("{}: {} is not a live stowage block", what, ptr));
  return owner;
}

// A refusal of `ptr` on `device`, when another device owns it: a message that says so.
void name_the_owner(Allocators& all, const void* ptr, int device, const char* what) {
  if (const int owner = owner_of(all, ptr); owner != -1 && owner != device)
    throw InvalidArgument(fmt::format("{}: {} belongs to device {}, not device {}", what, ptr, owner, device));
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
    device = named_or_owner(all, ptr, device, "stowage_free");  // PyTorch's raw_delete names no device
    try {
      all.get(device).top->deallocate(ptr, bytes);  // InvalidArgument for foreign pointers, double frees, wrong sizes
    } catch (const InvalidArgument&) {
      name_the_owner(all, ptr, device, "stowage_free");
      throw;
    }
    return 0;
  });
}

int stowage_empty_cache(int device) {
  return guarded(-1, [&] {
    Allocators& all = allocators();
    if (device != -1) {
      all.get(device).allocator->empty_cache();
      return 0;
    }
    // Every device's: refused in a forked child as each device's own call is, allocators made or not.
    refuse_if_devices_forked("stowage_empty_cache(-1)");
    for (int d = 0; d < all.count; ++d)
      if (DeviceAllocator* a = all.created(d)) a->allocator->empty_cache();
    return 0;
  });
}

int stowage_record_stream(void* ptr, int device, void* stream) {
  return guarded(-1, [&] {
    if (ptr == nullptr) throw InvalidArgument("stowage_record_stream: null pointer");
    Allocators& all = allocators();
    device = named_or_owner(all, ptr, device, "stowage_record_stream");  // PyTorch's hook names no device
    try {
      all.get(device).top->record_stream(ptr, stream_from_native(stream));
    } catch (const InvalidArgument&) {
      name_the_owner(all, ptr, device, "stowage_record_stream");
      throw;
    }
    return 0;
  });
}

int stowage_block_device(const void* ptr) {
  return guarded(-1, [&] {
    if (ptr == nullptr) return -1;
    Allocators& all = allocators();
    refuse_if_devices_forked("stowage_block_device");
    return owner_of(all, ptr);
  });
}

ssize_t stowage_get_stats(int device, char* buf, size_t len) {
  return guarded<ssize_t>(-1, [&]() -> ssize_t {
    check_buffer(buf, len, "stowage_get_stats");
    return copy_out(to_json(allocators().get(device).allocator->stats()), buf, len);
  });
}

ssize_t stowage_snapshot_json(int device, char* buf, size_t len) {
  return guarded<ssize_t>(-1, [&]() -> ssize_t {
    check_buffer(buf, len, "stowage_snapshot_json");
    return copy_out(to_json(allocators().get(device).allocator->snapshot()), buf, len);
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

int stowage_set_memory_fraction(int device, double fraction) {
  return guarded(-1, [&] {
    if (!(fraction >= 0.0 && fraction <= 1.0))
      throw InvalidArgument(fmt::format("stowage_set_memory_fraction: {} is not in [0, 1]", fraction));
    allocators().get(device).allocator->set_memory_fraction(fraction);
    return 0;
  });
}

ssize_t stowage_device_capacity(int device) {
  return guarded<ssize_t>(
      -1, [&] { return static_cast<ssize_t>(allocators().get(device).allocator->device().capacity()); });
}

int stowage_push_tag(const char* tag) {
  return guarded(-1, [&] {
    if (tag == nullptr) throw InvalidArgument("stowage_push_tag: null tag");
    tag_state("stowage_push_tag").tags.push_back(std::make_unique<ScopedTag>(tag));
    return 0;
  });
}

int stowage_pop_tag(void) {
  return guarded(-1, [&] {
    auto& tags = tag_state("stowage_pop_tag").tags;
    if (tags.empty()) throw InvalidArgument("stowage_pop_tag: no tag was pushed on this thread");
    tags.pop_back();
    return 0;
  });
}

DLManagedTensor* stowage_dlpack_empty(int device, const int64_t* shape, int ndim, uint8_t code, uint8_t bits,
                                      void* stream) {
  return guarded<DLManagedTensor*>(nullptr, [&] {
    const DType dtype = dtype_from_dlpack(DLDataType{code, bits, 1}, "stowage_dlpack_empty");
    capi::tensor_bytes(shape, ndim, dtype, "stowage_dlpack_empty");
    DeviceAllocator& a = allocators().get(device);
    return to_dlpack(
        TensorView::empty(a.top, dtype, std::vector<std::int64_t>(shape, shape + ndim), stream_from_native(stream)));
  });
}

int stowage_device_count(void) {
  return guarded(-1, [] { return allocators().count; });
}

int stowage_using_cuda(void) {
  return guarded(-1, [] { return using_cuda() ? 1 : 0; });
}

const char* stowage_last_error(void) {
  if (last_error_code == STOWAGE_OK) return "";
  const ThreadState* state = thread_memo.state;
  return state != nullptr ? state->last_error.c_str() : thread_memo.exit_message;
}

int stowage_last_error_code(void) { return last_error_code; }

}  // extern "C"
