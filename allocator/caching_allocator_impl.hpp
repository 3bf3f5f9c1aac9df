#pragma once
// The caching allocator's state, shared by its source files (allocation paths, growth and
// release, inspection). Every member function expects `mu` held unless it says otherwise.
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "allocator/address_map.hpp"
#include "allocator/block_pool.hpp"
#include "allocator/segment.hpp"
#include "allocator/trace_ring.hpp"
#include "stowage/caching_allocator.hpp"

namespace stowage {

struct CachingAllocator::Impl {
  Impl(Device& d, AllocatorOptions o);
  ~Impl();

  // A block freed while recorded on other streams, waiting for their events.
  struct Pending {
    detail::Block* block;
    std::vector<Event> events;
  };

  Device& device;
  AllocatorOptions opts;
  SegmentMode mode;
  std::size_t cap = 0;  // 0: none
  mutable std::mutex mu;
  detail::BlockPool pools[kPoolCount]{detail::BlockPool(Pool::small), detail::BlockPool(Pool::large)};
  detail::AddressMap live;  // allocated blocks by address
  std::vector<std::unique_ptr<detail::Segment>> classic;     // classic segments
  std::unique_ptr<detail::Segment> expandable[kPoolCount];   // one reservation per pool
  std::vector<Pending> pending;
  std::vector<Event> spare_events;
  AllocatorStats st;
  std::uint64_t tick = 0;
  detail::TraceRing trace;

  detail::BlockPool& pool(Pool p) { return pools[static_cast<int>(p)]; }
  std::size_t limit() const;  // bytes the allocator may reserve
  std::size_t max_split() const { return mode == SegmentMode::classic ? opts.max_split_size : 0; }

  // --- allocation paths (caching_allocator.cpp) ---
  void* hand_out(detail::Block* b, std::size_t bytes, std::size_t rounded, Stream stream);
  detail::Block* slow_find(std::size_t bytes, std::size_t rounded, Pool p, Stream stream);
  detail::Block* take_from_other_streams(std::size_t rounded, Pool p, Stream stream);
  void complete_free(detail::Block* b);
  void process_events();
  Event take_event();
  void sync_split_stat(Pool p);

  // --- growth and release (allocator_growth.cpp) ---
  void grow(Pool p, std::size_t rounded, Stream stream);  // OutOfMemory when refused
  void grow_classic(Pool p, std::size_t rounded, Stream stream);
  void grow_expandable(Pool p, std::size_t rounded, Stream stream);
  // Synchronises the device, completes pending frees, then gives back up to `want` bytes of
  // cached memory (oldest first when asked). Returns bytes given back.
  std::size_t release_cached(std::size_t want, bool oldest_first);
  std::size_t release_block(detail::Block* b);
  void maybe_collect_garbage(Pool p, std::size_t rounded);
  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t rounded, const std::string& why);
  std::size_t largest_free_block() const;
  std::string describe_foreign(std::uintptr_t addr) const;
  void release_everything() noexcept;

  // --- inspection (allocator_inspect.cpp) ---
  std::vector<SegmentInfo> segment_infos() const;
};

}  // namespace stowage
