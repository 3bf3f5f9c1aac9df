#pragma once
// An adaptor that caps the bytes live through it (as asked) at a limit, over any upstream
// resource: a budget for one technique or one tenant of a shared device. (The caching
// allocator's memory_cap is different: it caps the bytes the allocator reserves from the device.)
#include <mutex>
#include <unordered_map>

#include "stowage/memory_resource.hpp"

namespace stowage {

class LimitingResource final : public MemoryResource {
 public:
  LimitingResource(ResourceHandle upstream, std::size_t limit_bytes)
      : upstream_(std::move(upstream)), limit_(limit_bytes) {}
  Device& device() const override { return upstream_->device(); }
  MemoryResource* upstream() const override { return upstream_.raw(); }

  std::size_t limit() const;
  void set_limit(std::size_t bytes);  // a lower limit refuses new allocations; live ones stay
  std::size_t allocated() const;      // bytes live through this adaptor

 protected:
  void* do_allocate(std::size_t bytes, Stream stream) override;  // OutOfMemory past the limit
  void do_deallocate(void* ptr, std::size_t bytes) override;
  void do_record_stream(void* ptr, Stream stream) override { upstream_->record_stream(ptr, stream); }

 private:
  ResourceHandle upstream_;
  mutable std::mutex mutex_;
  std::size_t limit_;
  std::size_t allocated_ = 0;
  std::unordered_map<void*, std::size_t> live_;
};

}  // namespace stowage
