#pragma once
// A block: a contiguous range inside a segment, either handed to a user, pending (freed but
// still in use on other streams) or free. Blocks of one segment form an address-ordered list.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "stowage/allocator_stats.hpp"
#include "stowage/device.hpp"

namespace stowage::detail {

struct Segment;

// The stream of a free block none of whose earlier uses can still be running (fresh memory, or
// memory after a device-wide synchronisation): any stream may take it without waiting.
inline constexpr Stream kAnyStream{std::numeric_limits<std::uintptr_t>::max()};

enum class BlockUse : std::uint8_t { free, allocated, pending };

// Cache-line aligned: threads that allocate at once write to their own blocks without sharing a line.
struct alignas(64) Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  Stream stream{};  // allocated/pending: the stream it was allocated on; free: last user
  BlockUse use = BlockUse::free;
  Pool pool = Pool::large;
  Segment* segment = nullptr;
  Block* prev = nullptr;  // address neighbours within the same contiguous mapping
  Block* next = nullptr;
  std::uint64_t free_tick = 0;  // when it last became free (for the gc's oldest-first order)
  std::vector<Stream> uses;     // other streams it was recorded on
  std::string tag;
  Block* cache_next = nullptr;  // in a thread cache: the next block of its bin
  // In a thread cache. Such a block stays filed in the live map (a fast free and the allocation
  // that reuses it then skip the map), but is not live: every lookup checks this. Set under the
  // block's shard lock; cleared by the cache's owner when it hands the block out again.
  std::atomic<bool> cached{false};
  // Set when handed out: the block has address neighbours or lies in an expandable segment, so,
  // freed, it counts as split memory. Fixed while the block is live (only free blocks split or
  // merge), and read by the fast path without the device-wide lock instead of prev/next.
  bool split_member = false;

  bool is_free() const { return use == BlockUse::free; }
  std::uintptr_t end() const { return addr + size; }
};

// Free blocks by (stream, size, address): best fit on a stream is one lower_bound.
struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->addr < b->addr;
  }
};
using FreeSet = std::set<Block*, BlockOrder>;

// Two free neighbours may become one block when no stream has to wait for the other's uses.
inline bool streams_compatible(Stream a, Stream b) { return a == b || a == kAnyStream || b == kAnyStream; }
inline Stream merged_stream(Stream a, Stream b) { return a == kAnyStream ? b : a; }

}  // namespace stowage::detail
