#pragma once
// The simplest memory resource: every allocation is a device allocation (cudaMalloc-like) and
// every free gives it back once the device is idle. No caching; a baseline, and an upstream for
// adaptors in tests and tools.
#include <mutex>
#include <unordered_map>

#include "stowage/memory_resource.hpp"

namespace stowage {

class DeviceResource final : public MemoryResource {
 public:
  // The device must outlive the resource (Device::attach).
  explicit DeviceResource(Device& device);
  ~DeviceResource() override;  // gives back what is still allocated
  Device& device() const override { return device_; }

 protected:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes) override;
  void do_record_stream(void* ptr, Stream stream) override;

 private:
  Device& device_;
  Dependency use_;  // on device_
  std::mutex mutex_;
  std::unordered_map<void*, std::size_t> live_;  // size asked for
};

}  // namespace stowage
