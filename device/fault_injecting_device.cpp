#include <fmt/format.h>

#include <atomic>
#include <charconv>
#include <mutex>
#include <sstream>

#include "stowage/fault_injection.hpp"

namespace stowage {

struct FaultInjectingDevice::State {
  std::mutex mutex;
  FaultPlan plan;
  std::uint64_t calls[5] = {};
  FaultCounts injected;
};

namespace {
enum Kind { kAlloc, kMap, kPin, kCopy, kRecord };
const char* const kNames[] = {"allocation", "map", "pin", "copy", "record"};
}  // namespace

FaultPlan parse_fault_plan(const std::string& text) {
  FaultPlan plan;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos) throw ParseError(fmt::format("STOWAGE_FAULTS: '{}' is not key=N", item));
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    std::uint64_t n = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || end != value.data() + value.size())
      throw ParseError(fmt::format("STOWAGE_FAULTS: '{}' for {} is not a whole number", value, key));
    if (key == "alloc") plan.allocation_every = n;
    else if (key == "map") plan.map_every = n;
    else if (key == "pin") plan.pin_every = n;
    else if (key == "copy") plan.copy_every = n;
    else if (key == "record") plan.record_every = n;
    else throw ParseError(fmt::format("STOWAGE_FAULTS: unknown key '{}' (alloc, map, pin, copy, record)", key));
  }
  return plan;
}

FaultInjectingDevice::FaultInjectingDevice(std::unique_ptr<Device> inner, FaultPlan plan)
    : inner_(std::move(inner)), state_(std::make_unique<State>()) {
  if (!inner_) throw InvalidArgument("FaultInjectingDevice needs a device");
  state_->plan = plan;
  share_stream_epoch(*inner_);
}

FaultInjectingDevice::~FaultInjectingDevice() { check_no_dependents(); }

FaultCounts FaultInjectingDevice::injected() const {
  std::lock_guard lock(state_->mutex);
  return state_->injected;
}

void FaultInjectingDevice::set_plan(FaultPlan plan) {
  std::lock_guard lock(state_->mutex);
  state_->plan = plan;
  for (auto& c : state_->calls) c = 0;
}

// Counts a call of `kind`; throws the injected failure when it is the Nth.
#define STOWAGE_FAULT(kind, every, counter, Exception)                                                          \
  do {                                                                                                          \
    std::lock_guard lock(state_->mutex);                                                                        \
    const auto n = state_->plan.every;                                                                          \
    if (n != 0 && ++state_->calls[kind] % n == 0) {                                                             \
      ++state_->injected.counter;                                                                               \
      throw Exception(                                                                                          \
          fmt::format("injected {} fault on device {} (every {}th call)", kNames[kind], inner_->ordinal(), n)); \
    }                                                                                                           \
  } while (0)

const DeviceProperties& FaultInjectingDevice::properties() const { return inner_->properties(); }
std::size_t FaultInjectingDevice::free_memory() const { return inner_->free_memory(); }
DeviceCounters FaultInjectingDevice::counters() const { return inner_->counters(); }

void* FaultInjectingDevice::allocate(std::size_t bytes) {
  STOWAGE_FAULT(kAlloc, allocation_every, allocation, OutOfMemory);
  return inner_->allocate(bytes);
}
void FaultInjectingDevice::deallocate(void* ptr) { inner_->deallocate(ptr); }
void* FaultInjectingDevice::reserve(std::size_t bytes) {
  STOWAGE_FAULT(kMap, map_every, map, DeviceError);
  return inner_->reserve(bytes);
}
void FaultInjectingDevice::unreserve(void* base, std::size_t bytes) { inner_->unreserve(base, bytes); }
PhysicalHandle FaultInjectingDevice::create_physical(std::size_t bytes, const PhysicalOptions& options) {
  STOWAGE_FAULT(kAlloc, allocation_every, allocation, OutOfMemory);
  return inner_->create_physical(bytes, options);
}
void FaultInjectingDevice::destroy_physical(PhysicalHandle h) { inner_->destroy_physical(h); }
void FaultInjectingDevice::map(void* va, std::size_t bytes, PhysicalHandle h, std::size_t offset) {
  STOWAGE_FAULT(kMap, map_every, map, DeviceError);
  inner_->map(va, bytes, h, offset);
}
void FaultInjectingDevice::unmap(void* va, std::size_t bytes) { inner_->unmap(va, bytes); }
void FaultInjectingDevice::set_access(void* va, std::size_t bytes) {
  STOWAGE_FAULT(kMap, map_every, map, DeviceError);
  inner_->set_access(va, bytes);
}
int FaultInjectingDevice::export_handle(PhysicalHandle h) { return inner_->export_handle(h); }
Stream FaultInjectingDevice::create_stream(int priority) { return inner_->create_stream(priority); }
void FaultInjectingDevice::destroy_stream(Stream s) { inner_->destroy_stream(s); }
void FaultInjectingDevice::check_stream(Stream s) { inner_->check_stream(s); }
std::pair<int, int> FaultInjectingDevice::priority_range() const { return inner_->priority_range(); }
void FaultInjectingDevice::synchronize(Stream s) { inner_->synchronize(s); }
void FaultInjectingDevice::synchronize() { inner_->synchronize(); }
Event FaultInjectingDevice::create_event(bool timing) { return inner_->create_event(timing); }
void FaultInjectingDevice::destroy_event(Event e) { inner_->destroy_event(e); }
void FaultInjectingDevice::record(Event e, Stream s) {
  STOWAGE_FAULT(kRecord, record_every, record, DeviceError);
  inner_->record(e, s);
}
void FaultInjectingDevice::wait(Stream s, Event e) { inner_->wait(s, e); }
bool FaultInjectingDevice::query(Event e) { return inner_->query(e); }
void FaultInjectingDevice::synchronize(Event e) { inner_->synchronize(e); }
float FaultInjectingDevice::elapsed_ms(Event a, Event b) { return inner_->elapsed_ms(a, b); }
void FaultInjectingDevice::copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream s) {
  STOWAGE_FAULT(kCopy, copy_every, copy, DeviceError);
  inner_->copy_async(dst, src, bytes, kind, s);
}
void FaultInjectingDevice::fill_async(void* dst, std::uint8_t value, std::size_t bytes, Stream s) {
  STOWAGE_FAULT(kCopy, copy_every, copy, DeviceError);
  inner_->fill_async(dst, value, bytes, s);
}
void FaultInjectingDevice::pin_host(void* ptr, std::size_t bytes) {
  STOWAGE_FAULT(kPin, pin_every, pin, DeviceError);
  inner_->pin_host(ptr, bytes);
}
void FaultInjectingDevice::unpin_host(void* ptr) { inner_->unpin_host(ptr); }
bool FaultInjectingDevice::is_pinned(const void* ptr) const { return inner_->is_pinned(ptr); }
void* FaultInjectingDevice::device_pointer_of_host(void* p) { return inner_->device_pointer_of_host(p); }
void FaultInjectingDevice::launch_host(Stream s, std::function<void()> fn) { inner_->launch_host(s, std::move(fn)); }

}  // namespace stowage
