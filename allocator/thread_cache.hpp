#pragma once
// A thread's cache of blocks it freed, for its next allocations of the same size on the same
// stream: the caching allocator's fast path, which takes no device-wide lock.
//
// Statistics stay exact. A cache keeps its thread's changes to the current values as deltas
// (folded into the allocator's statistics whenever the allocator takes its device-wide lock), and
// peaks are exact through leases: a cache may change a statistic's total only within the
// headroom the allocator granted it, and the allocator keeps, for every statistic,
//     total + (headroom of every cache) <= peak,
// so a fast operation never passes a recorded peak; one that would goes the slow way, which sees
// every total and records the new peak (caching_allocator_fast.cpp).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "allocator/block.hpp"
#include "allocator/spin_lock.hpp"

namespace stowage::detail {

// The statistics a fast allocation or free changes, each for all pools and for its own pool:
// allocated_bytes, active_bytes, requested_bytes, allocation, inactive_split_bytes.
inline constexpr int kFastStats = 5;
inline constexpr int kFastSlots = 3;  // all, small_pool, large_pool

// Handing out (sign +1) or taking back (sign -1) a cached block of `size` bytes asked for as
// `requested`: the change of each statistic, for all pools and for `pool`.
struct FastDelta {
  std::int64_t by_stat[kFastStats];
  int pool_slot;  // 1: small_pool, 2: large_pool
};
inline FastDelta fast_delta(int sign, std::size_t size, std::size_t requested, Pool pool) {
  const auto s = static_cast<std::int64_t>(size) * sign;
  return {{s, s, static_cast<std::int64_t>(requested) * sign, sign, -s}, pool == Pool::small ? 1 : 2};
}

struct alignas(64) ThreadCache {
  SpinLock lock;  // held by the owner for each fast operation, by the allocator to fold or drain
  std::int64_t headroom[kFastStats][kFastSlots] = {};
  // Changes since the last fold, by pool (the totals for all pools are their sums).
  std::int64_t current[kPoolCount][kFastStats] = {};    // of Stat::current
  std::int64_t allocated[kPoolCount][kFastStats] = {};  // of Stat::allocated
  std::int64_t freed[kPoolCount][kFastStats] = {};      // of Stat::freed
  std::int64_t hits = 0;                                // allocations served here since the last fold
  std::size_t bytes = 0;                                // bytes of the blocks cached
  bool detached = false;                                // the allocator is gone
  // The device's stream_epoch() when every stream a bin names was last found alive: while the
  // device's count is still this, none of them has been destroyed. kUnchecked when a bin names a
  // stream not checked yet. The fast path serves only while it holds (streams_current()).
  static constexpr std::uint64_t kUnchecked = ~std::uint64_t{0};
  std::uint64_t stream_epoch = kUnchecked;
  bool streams_current(std::uint64_t device_epoch) const { return stream_epoch == device_epoch; }

  struct Bin {
    Stream stream;
    std::size_t key;  // the rounded size asked for when the block was handed out
    Block* head;
    std::size_t count;
  };
  static constexpr std::size_t kMaxBins = 32;
  std::vector<Bin> bins;

  // Whether the headroom allows d, and taking it.
  bool affords(const FastDelta& d) const;
  void apply(const FastDelta& d);
  // The two fast operations' statistics in one step each: false, changing nothing, when the
  // headroom does not allow them. Unrolled: this is the hot path.
  bool lease_allocation(std::size_t size, std::size_t requested, Pool pool) {
    const auto s = static_cast<std::int64_t>(size), r = static_cast<std::int64_t>(requested);
    const int slot = pool == Pool::small ? 1 : 2, p = slot - 1;
    auto& h = headroom;
    if (s > h[0][0] || s > h[0][slot] || s > h[1][0] || s > h[1][slot] || r > h[2][0] || r > h[2][slot] ||
        1 > h[3][0] || 1 > h[3][slot])
      return false;
    const std::int64_t v[kFastStats] = {s, s, r, 1, -s};
    for (int k = 0; k < kFastStats; ++k) {
      h[k][0] -= v[k];
      h[k][slot] -= v[k];
      current[p][k] += v[k];
    }
    for (int k = 0; k < 4; ++k) allocated[p][k] += v[k];
    freed[p][4] += s;
    return true;
  }
  bool lease_free(std::size_t size, std::size_t requested, Pool pool) {
    const auto s = static_cast<std::int64_t>(size), r = static_cast<std::int64_t>(requested);
    const int slot = pool == Pool::small ? 1 : 2, p = slot - 1;
    auto& h = headroom;
    if (s > h[4][0] || s > h[4][slot]) return false;
    const std::int64_t v[kFastStats] = {-s, -s, -r, -1, s};
    for (int k = 0; k < kFastStats; ++k) {
      h[k][0] -= v[k];
      h[k][slot] -= v[k];
      current[p][k] += v[k];
    }
    for (int k = 0; k < 4; ++k) freed[p][k] -= v[k];
    allocated[p][4] += s;
    return true;
  }

  Block* take(Stream stream, std::size_t key);
  // Files b under (its stream, key); false, filing nothing, when the cache has no bin for it
  // and kMaxBins already.
  bool put(Block* b, std::size_t key);
  bool can_put(Stream stream, std::size_t key) const;
  std::vector<Block*> take_all();
  // Takes out the blocks of every bin whose stream `gone(stream)` says is gone, and the bins.
  template <class Gone>
  std::vector<Block*> take_streams(Gone&& gone) {
    std::vector<Block*> out;
    std::erase_if(bins, [&](Bin& bin) {
      if (!gone(bin.stream)) return false;
      for (Block* b = bin.head; b != nullptr;) {
        Block* next = b->cache_next;
        b->cache_next = nullptr;
        bytes -= b->size;
        out.push_back(b);
        b = next;
      }
      return true;
    });
    return out;
  }
};

// The part of an allocator its threads' caches outlive: the device-wide lock and the list of
// caches, shared with every cache so a thread that exits after its allocator finds it gone.
struct CacheOwner {
  std::mutex mu;              // the allocator's device-wide lock
  void* allocator = nullptr;  // CachingAllocator::Impl*, nullptr once destroyed
  std::vector<std::shared_ptr<ThreadCache>> caches;
  // Called with mu held when a thread exits while the allocator lives: the cache's blocks go
  // back to their pools and its statistics into the allocator's.
  void (*retire)(void* allocator, const std::shared_ptr<ThreadCache>& cache) = nullptr;
};

}  // namespace stowage::detail
