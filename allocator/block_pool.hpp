#pragma once
// One pool (small or large) of blocks: the free set, best-fit search, splitting and coalescing.
// Not thread-safe; the allocator holds its lock around every call.
#include <cstddef>
#include <vector>

#include "allocator/block.hpp"

namespace stowage::detail {

class BlockPool {
 public:
  explicit BlockPool(Pool pool) : pool_(pool) {}
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  Pool pool() const { return pool_; }
  const FreeSet& free_blocks() const { return free_; }

  // A zeroed block object (recycled when possible) and its return.
  Block* new_block();
  void recycle(Block* b);

  // Smallest free block of at least `rounded` bytes usable on `stream` at once (its own free
  // blocks or kAnyStream ones). max_split > 0: blocks that large serve only requests that large,
  // wasting under kLargeBuffer. nullptr when none.
  Block* find(std::size_t rounded, Stream stream, std::size_t max_split) const;
  // The same among free blocks last used on other streams (usable after a device-side wait).
  Block* find_other_stream(std::size_t rounded, Stream stream, std::size_t max_split) const;

  void remove(Block* b);  // takes a free block out of the free set
  // Marks b free, merges it with compatible free neighbours and files it; returns the result.
  Block* insert(Block* b);
  // b (taken out of the set and marked allocated) keeps its first `rounded` bytes; the rest
  // becomes a free block of b's former stream, filed and returned.
  Block* split(Block* b, std::size_t rounded, Stream rest_stream);

  // After a device-wide synchronisation no earlier use can still run: every free block becomes
  // usable on any stream, and free neighbours merge.
  void coalesce_all_as_any();

  // Free bytes in classic segments that are wholly free (not fragmentation).
  std::size_t unsplit_free_bytes() const { return unsplit_free_; }

 private:
  Block* best_on(Stream stream, std::size_t rounded, std::size_t max_split) const;
  void absorb_next(Block* b);  // b takes over its (free) next neighbour
  void count_in(const Block* b, bool in);
  void file(Block* b);  // into the free set, reusing a spare tree node

  Pool pool_;
  FreeSet free_;
  std::vector<Block*> spare_;
  std::vector<FreeSet::node_type> spare_nodes_;  // set nodes kept so the hot path does not allocate
  std::size_t unsplit_free_ = 0;
  std::size_t any_stream_blocks_ = 0;  // free blocks on kAnyStream: skip that search when none
};

}  // namespace stowage::detail
