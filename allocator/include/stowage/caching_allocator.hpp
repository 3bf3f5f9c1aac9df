#pragma once
// The stream-ordered caching allocator: one instance per device, a MemoryResource that draws on
// the device itself (segments, or granules of an expandable reservation) and caches what it frees.
#include <cstddef>
#include <memory>

#include "stowage/allocator_options.hpp"
#include "stowage/allocator_stats.hpp"
#include "stowage/device.hpp"
#include "stowage/memory_resource.hpp"
#include "stowage/scoped_tag.hpp"
#include "stowage/snapshot.hpp"

namespace stowage {

class CachingAllocator final : public MemoryResource {
 public:
  // The device must outlive the allocator (destroyed first, it ends the process with a message
  // naming both: Device::attach).
  explicit CachingAllocator(Device& device, AllocatorOptions options = {});
  ~CachingAllocator() override;  // gives every segment back; live blocks are reported as leaks in the log

  Device& device() const override;
  const AllocatorOptions& options() const;
  SegmentMode segment_mode() const;  // what is in effect (expandable falls back to classic)

  // allocate(), deallocate() and record_stream() are MemoryResource's. A freed block is reusable
  // on its stream at once, elsewhere after the streams it was recorded on reach that point.
  // deallocate() checks a non-zero size against the size asked for (or the block's size).
  // In a process forked from the one that made the allocator, they and every member function
  // below throw DeviceError, before taking a lock (docs/allocator.md, "After fork()"). Functions
  // queued with Device::launch_host must not call it (see there).

  // The rounded size of a live block; InvalidArgument for a pointer this allocator did not give.
  std::size_t block_size(const void* ptr) const;
  bool owns(const void* ptr) const;

  // Gives every free segment (or whole free granule) back to the device.
  void empty_cache();
  void set_memory_cap(std::size_t bytes);  // 0 removes the cap
  // A cap of `fraction` (in [0, 1]) of the device's capacity, at least one byte (0: every new
  // reservation is refused); 1 removes the cap, as in PyTorch.
  void set_memory_fraction(double fraction);
  std::size_t memory_cap() const;

  AllocatorStats stats() const;
  void reset_peak_stats();
  Snapshot snapshot() const;

 protected:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  void do_deallocate(void* ptr, std::size_t bytes) override;
  void do_record_stream(void* ptr, Stream stream) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stowage
