#pragma once
// An adaptor that counts what passes through it to any upstream resource: bytes (as asked) and
// allocations, current, peak and totals. For the caching allocator's own view (reserved,
// fragmentation, pools) use CachingAllocator::stats().
#include <mutex>
#include <unordered_map>

#include "stowage/allocator_stats.hpp"
#include "stowage/memory_resource.hpp"

namespace stowage {

struct ResourceStatistics {
  Stat bytes;        // bytes asked for by live allocations
  Stat allocations;  // live allocations
};

class StatisticsResource final : public MemoryResource {
 public:
  explicit StatisticsResource(ResourceHandle upstream) : upstream_(std::move(upstream)) {}
  Device& device() const override { return upstream_->device(); }
  MemoryResource* upstream() const override { return upstream_.raw(); }

  ResourceStatistics statistics() const;
  void reset_peaks();

 protected:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes) override;
  void do_record_stream(void* ptr, Stream stream) override { upstream_->record_stream(ptr, stream); }

 private:
  ResourceHandle upstream_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, std::size_t> live_;
  ResourceStatistics stats_;
};

}  // namespace stowage
