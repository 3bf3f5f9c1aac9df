#include "stowage/device_resource.hpp"

#include <fmt/format.h>

#include "common/log.hpp"

namespace stowage {

DeviceResource::DeviceResource(Device& device)
    : device_(device), use_(device.attach(fmt::format("DeviceResource {}", fmt::ptr(this)))) {}

DeviceResource::~DeviceResource() {
  try {
    if (!live_.empty()) device_.synchronize();
    for (auto& [ptr, bytes] : live_) device_.deallocate(ptr);
  } catch (const std::exception& e) {
    log().error("DeviceResource: giving back {} allocation(s) failed: {}", live_.size(), e.what());
  }
}

void* DeviceResource::do_allocate(std::size_t bytes, Stream) {
  check_not_forked("stowage: DeviceResource::allocate");
  if (bytes == 0) return nullptr;
  std::lock_guard lock(mutex_);
  void* p = device_.allocate(bytes);
  try {
    live_.emplace(p, bytes);
  } catch (...) {
    device_.deallocate(p);
    throw;
  }
  return p;
}

void DeviceResource::do_deallocate(void* ptr, std::size_t bytes) {
  check_not_forked("stowage: DeviceResource::deallocate");
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end())
    throw InvalidArgument(fmt::format("DeviceResource: free of {}, which it did not give out", ptr));
  if (bytes != 0 && bytes != it->second) {
    throw InvalidArgument(fmt::format("DeviceResource: free of {} with size {} bytes, but it was allocated with {}",
                                      ptr, bytes, it->second));
  }
  // No stream bookkeeping: whatever any stream still does with the memory finishes first.
  device_.synchronize();
  device_.deallocate(ptr);
  live_.erase(it);
}

void DeviceResource::do_record_stream(void* ptr, Stream) {
  check_not_forked("stowage: DeviceResource::record_stream");
  std::lock_guard lock(mutex_);
  if (!live_.count(ptr)) {
    throw InvalidArgument(fmt::format("DeviceResource: record_stream on {}, which is not a live allocation", ptr));
  }
}

}  // namespace stowage
