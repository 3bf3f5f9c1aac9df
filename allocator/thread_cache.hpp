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
#include "common/fork_generation.hpp"

namespace stowage::detail {

// What a fast operation moves, for all pools and for its block's pool: the block's bytes (in
// allocated_bytes and active_bytes alike, and against them in inactive_split_bytes), the bytes
// asked for (requested_bytes), and one allocation.
struct FastMoves {
  std::int64_t bytes_in = 0, bytes_out = 0;          // blocks handed out / taken back
  std::int64_t requested_in = 0, requested_out = 0;  // their requested bytes
  std::int64_t count_in = 0, count_out = 0;          // how many
};

// The leases, one per quantity a fast operation can raise: the block bytes (bounding
// allocated_bytes and active_bytes at once: they move together), requested bytes, allocations,
// and inactive split bytes (which a fast free raises).
enum FastLease : int { kLeaseBytes, kLeaseRequested, kLeaseCount, kLeaseInactive, kLeaseKinds };
inline constexpr int kFastSlots = 3;  // all, small_pool, large_pool

struct alignas(64) ThreadCache {
  SpinLock lock;  // held by the owner for each fast operation, by the allocator to fold or drain
  std::int64_t headroom[kLeaseKinds][kFastSlots] = {};
  FastMoves moves[kPoolCount];  // since the last fold, by pool
  std::int64_t hits = 0;        // allocations served here since the last fold
  std::size_t bytes = 0;        // bytes of the blocks cached
  bool detached = false;        // the allocator is gone
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
  // All the bins it may have, at once: filing a block never allocates, so a free that has marked
  // its block cached cannot fail part-way.
  ThreadCache() { bins.reserve(kMaxBins); }

  // The two fast operations' statistics in one step each: false, changing nothing, when the
  // headroom does not allow them. What one lowers it gives back as headroom.
  bool lease_allocation(std::size_t size, std::size_t requested, Pool pool) {
    const auto s = static_cast<std::int64_t>(size), r = static_cast<std::int64_t>(requested);
    const int slot = pool == Pool::small ? 1 : 2;
    std::int64_t* b = headroom[kLeaseBytes];
    std::int64_t* q = headroom[kLeaseRequested];
    std::int64_t* n = headroom[kLeaseCount];
    std::int64_t* i = headroom[kLeaseInactive];
    if (s > b[0] || s > b[slot] || r > q[0] || r > q[slot] || n[0] < 1 || n[slot] < 1) return false;
    b[0] -= s, b[slot] -= s, q[0] -= r, q[slot] -= r, --n[0], --n[slot], i[0] += s, i[slot] += s;
    FastMoves& m = moves[slot - 1];
    m.bytes_in += s, m.requested_in += r, ++m.count_in;
    return true;
  }
  bool lease_free(std::size_t size, std::size_t requested, Pool pool) {
    const auto s = static_cast<std::int64_t>(size), r = static_cast<std::int64_t>(requested);
    const int slot = pool == Pool::small ? 1 : 2;
    std::int64_t* b = headroom[kLeaseBytes];
    std::int64_t* q = headroom[kLeaseRequested];
    std::int64_t* n = headroom[kLeaseCount];
    std::int64_t* i = headroom[kLeaseInactive];
    if (s > i[0] || s > i[slot]) return false;
    i[0] -= s, i[slot] -= s, b[0] += s, b[slot] += s, q[0] += r, q[slot] += r, ++n[0], ++n[slot];
    FastMoves& m = moves[slot - 1];
    m.bytes_out += s, m.requested_out += r, ++m.count_out;
    return true;
  }
  void revoke_headroom() {
    for (auto& per_lease : headroom)
      for (std::int64_t& h : per_lease) h = 0;
  }

  // The bin of (stream, key), nullptr when there is none yet. Inline: the hot path.
  Bin* find(Stream stream, std::size_t key) {
    for (Bin& bin : bins)
      if (bin.key == key && bin.stream == stream) return &bin;
    return nullptr;
  }
  Block* take(Stream stream, std::size_t key) {
    Bin* bin = find(stream, key);
    if (bin == nullptr || bin->head == nullptr) return nullptr;
    Block* b = bin->head;
    bin->head = b->cache_next;
    b->cache_next = nullptr;
    --bin->count;
    bytes -= b->size;
    return b;
  }
  void push(Bin& bin, Block* b) {
    b->cache_next = bin.head;
    bin.head = b;
    ++bin.count;
    bytes += b->size;
  }
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
  std::mutex mu;  // the allocator's device-wide lock
  // The process the allocator was made in. In a forked child its locks may be held by a parent's
  // thread that is not there: a thread's caches of it are dropped, never locked.
  const unsigned generation = fork_generation();
  void* allocator = nullptr;  // CachingAllocator::Impl*, nullptr once destroyed
  std::vector<std::shared_ptr<ThreadCache>> caches;
  // Called with mu held when a thread exits while the allocator lives: the cache's blocks go
  // back to their pools and its statistics into the allocator's.
  void (*retire)(void* allocator, const std::shared_ptr<ThreadCache>& cache) = nullptr;
};

}  // namespace stowage::detail
