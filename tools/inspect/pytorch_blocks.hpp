#pragma once
// The block sizes behind a PyTorch trace: its entries hold requested sizes, its allocator
// accounts blocks (CUDACachingAllocator.cpp), so allocated bytes and their peak need the blocks.
#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <vector>

#include "stowage/snapshot.hpp"

namespace stowage::inspect {

// The snapshot's "allocator_settings" that decide a block's size; defaults where absent (older
// PyTorch does not write them; 2.11 does) or of the wrong type.
struct PyTorchBlockRules {
  std::array<std::uint64_t, 16> divisions{};  // roundup_power2_divisions per power of two from 1 MiB
  std::uint64_t max_split_size = UINT64_MAX;
  bool expandable = false;  // expandable_segments: every rest is split off
};
PyTorchBlockRules pytorch_block_rules(const nlohmann::json& snapshot);

// PyTorch's round_size: at least 512 bytes, a multiple of 512, or with roundup_power2_divisions
// the next of that many steps between two powers of two.
std::uint64_t round_size(std::uint64_t requested, const PyTorchBlockRules& rules);

// Sets the size of every alloc, free_requested and free_completed in s.trace (`requested`: the
// sizes PyTorch wrote) to its block's: a block live now has its size in the segments; any other
// is replayed from the segment_alloc that created its segment (PyTorch splits the rest off a free
// block only when that rest is 512 bytes or more in the small pool, more than 1 MiB and the
// request under max_split_size in the large one, and merges free neighbours), else, in a segment
// created before the trace, the request rounded (round_size). A free takes its allocation's size.
void to_block_sizes(Snapshot& s, const std::vector<std::uint64_t>& requested, const PyTorchBlockRules& rules);

}  // namespace stowage::inspect
