#pragma once
// The caching allocator's state, shared by its source files (allocation paths, the threads'
// caches, growth and release, inspection). Every member function expects an Exclusive section
// (the device-wide lock `mu` and every thread cache's lock) unless it says otherwise.
#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "allocator/block_pool.hpp"
#include "allocator/live_blocks.hpp"
#include "allocator/segment.hpp"
#include "allocator/thread_cache.hpp"
#include "allocator/trace_ring.hpp"
#include "common/fork_generation.hpp"
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
  Dependency use;  // on the device, which must outlive the allocator; declared first: released last
  AllocatorOptions opts;
  SegmentMode mode;
  std::size_t cap = 0;                        // 0: none
  std::shared_ptr<detail::CacheOwner> owner;  // the device-wide lock and the threads' caches
  std::mutex& mu;                             // owner->mu
  const unsigned generation;                  // the process it was made in (owner->generation)
  bool thread_caches = false;                 // the fast path is on
  detail::BlockPool pools[kPoolCount]{detail::BlockPool(Pool::small), detail::BlockPool(Pool::large)};
  detail::LiveBlocks live;                                  // allocated blocks by address (locked per shard, not by mu)
  std::vector<std::unique_ptr<detail::Segment>> classic;    // classic segments
  std::unique_ptr<detail::Segment> expandable[kPoolCount];  // one reservation per pool
  std::vector<Pending> pending;
  std::vector<Event> spare_events;
  AllocatorStats st;
  std::uint64_t tick = 0;
  detail::TraceRing trace;

  detail::BlockPool& pool(Pool p) { return pools[static_cast<int>(p)]; }

  // Every entry point's first step, before any lock: in a process forked from the one that made
  // the allocator, a lock a parent's thread held at the fork stays held (the call would hang), and
  // its blocks are the parent's memory (fork_generation.hpp). DeviceError naming `what` then.
  void check_not_forked(const char* what) const {
    if (forked_since(generation)) [[unlikely]]
      refuse_forked(what);
  }
  [[noreturn, gnu::cold]] void refuse_forked(const char* what) const;

  // The device-wide lock and every thread cache's lock, the caches' statistics folded in: the
  // slow path and every reader of statistics, snapshots or segments run inside one. On leaving
  // it, the calling thread's cache is granted the headroom left (thread_cache.hpp).
  class Exclusive {
   public:
    explicit Exclusive(Impl& m);
    ~Exclusive();
    Exclusive(const Exclusive&) = delete;
    Exclusive& operator=(const Exclusive&) = delete;

   private:
    Impl& m_;
    std::unique_lock<std::mutex> lock_;
  };

  // --- the threads' caches (caching_allocator_fast.cpp) ---
  // The calling thread's cache; created (taking mu: never inside an Exclusive) when asked.
  detail::ThreadCache* thread_cache(bool create);
  [[gnu::noinline]] detail::ThreadCache* find_thread_cache(bool create);  // when the memo misses
  // Without mu: a cached block of the rounded size on the stream, within the cache's headroom;
  // nullptr when there is none.
  void* fast_allocate(std::size_t bytes, std::size_t rounded, Stream stream);
  // Without mu: b, marked cached in `live` and free of other streams' uses, into the calling
  // thread's cache; false when it does not fit or the headroom does not allow it.
  bool fast_free(detail::Block* b);
  bool cacheable(const detail::Block* b) const;
  // b, out of a thread cache for good (to its pool, or gone with its segment): out of `live` too.
  void uncache(detail::Block* b);
  // Inside an Exclusive, when streams were destroyed since c last checked: the blocks it keeps
  // for streams now gone go back to their pools (their work finished when the stream was
  // destroyed), and c's check is brought up to date.
  void check_cached_streams(detail::ThreadCache& c);
  // Inside an Exclusive: the same through the statistics themselves (peaks recorded exactly).
  void* hand_out_cached(std::size_t bytes, std::size_t rounded, Stream stream);
  bool cache_freed(detail::Block* b);
  void fold_caches();
  void grant_headroom(detail::ThreadCache* self);
  void drain_caches();  // every cached block back to its pool
  std::size_t cached_bytes() const;
  void detach_caches() noexcept;  // the allocator goes: caches forget their blocks
  static void retire_cache(void* allocator, const std::shared_ptr<detail::ThreadCache>& cache);
  // A cached block handed out (or taken back) as a fast operation would, through the statistics.
  void apply_exact(bool handed_out, const detail::Block& b, std::size_t requested);
  std::size_t limit() const;  // bytes the allocator may reserve
  std::size_t max_split() const { return mode == SegmentMode::classic ? opts.max_split_size : 0; }

  // --- allocation paths (caching_allocator.cpp) ---
  void* hand_out(detail::Block* b, std::size_t bytes, std::size_t rounded, Stream stream);
  void free_block(detail::Block* b);  // b taken out of `live`: pending on its uses, or free
  detail::Block* slow_find(std::size_t bytes, std::size_t rounded, Pool p, Stream stream);
  detail::Block* take_from_other_streams(std::size_t rounded, Pool p, Stream stream);
  void complete_free(detail::Block* b);
  // Whether work may still be queued on s. A stream destroyed through the device has finished
  // its work; one a framework destroyed itself cannot be told from a live one (CUDA).
  bool stream_alive(Stream s);
  void process_events();
  Event take_event();
  void sync_split_stat(Pool p);

  // --- growth and release (allocator_growth.cpp) ---
  // The free block that now serves `rounded` (OutOfMemory when refused). A classic segment made
  // for a request serves it whatever max_split says (it may round up past max_split), as PyTorch's.
  detail::Block* grow(Pool p, std::size_t rounded, Stream stream);
  detail::Block* grow_classic(Pool p, std::size_t rounded, Stream stream);
  void grow_expandable(Pool p, std::size_t rounded, Stream stream);
  // Synchronises the device, completes pending frees, then gives back up to `want` bytes of
  // cached memory (oldest first when asked). Returns bytes given back.
  std::size_t release_cached(std::size_t want, bool oldest_first);
  std::size_t release_block(detail::Block* b);
  void maybe_collect_garbage(Pool p, std::size_t rounded);
  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t rounded, const std::string& why);
  std::size_t largest_free_block() const;
  std::string describe_foreign(std::uintptr_t addr) const;
  // Gives every segment and event back to the device. In a forked child, where they are the
  // parent's, only this process's copy of the bookkeeping goes.
  void release_everything() noexcept;

  // --- inspection (allocator_inspect.cpp) ---
  std::vector<SegmentInfo> segment_infos() const;
};

}  // namespace stowage
