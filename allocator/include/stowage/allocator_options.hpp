#pragma once
// The caching allocator's options, and their PyTorch-style text form.
#include <cstddef>
#include <string>
#include <vector>

namespace stowage {

enum class SegmentMode { classic, expandable };

struct AllocatorOptions {
  // Expandable segments where the device supports virtual memory (else classic). Classic
  // segments have PyTorch's sizes: the first block of 1-10 MiB needs a whole 20 MiB segment free
  // (under the cap too), so on a nearly full device it is out of memory (docs/allocator.md).
  SegmentMode segments = SegmentMode::expandable;
  // A cap on reserved bytes: absolute bytes, or a fraction of capacity (0 = none).
  std::size_t memory_cap_bytes = 0;
  double memory_cap_fraction = 0.0;
  // Under a cap (memory_cap_*, set_memory_fraction/cap): when reserved bytes would exceed this
  // fraction of it, free cached blocks that have not been used recently before growing (0 =
  // off; without a cap nothing is collected, as in PyTorch). PyTorch's garbage_collection_threshold.
  double gc_threshold = 0.0;
  // Blocks this large or larger are never split (0 = no limit). PyTorch's max_split_size_mb.
  std::size_t max_split_size = 0;
  // Record a trace of allocator events for snapshots; ring size in events (0 = off).
  std::size_t trace_entries = 0;
  // Reserve this much address space per expandable pool (default: 2x device capacity).
  std::size_t expandable_reserve = 0;
  // Each thread keeps up to this many bytes of blocks it freed for its own next allocations of
  // the same size on the same stream, served without the allocator's device-wide lock (0 = off).
  // Only blocks of at most thread_cache_max_block bytes that are part of a split or expandable
  // segment are kept; a snapshot trace (trace_entries) turns the caches off.
  std::size_t thread_cache_bytes = std::size_t{32} << 20;
  std::size_t thread_cache_max_block = std::size_t{4} << 20;
};

// Parses PyTorch-style configuration text, e.g.
// "expandable_segments:True,max_split_size_mb:512,garbage_collection_threshold:0.8",
// plus stowage's keys (memory_cap_mb, memory_cap_fraction, trace_entries, expandable_reserve_mb,
// thread_cache_mb, thread_cache_max_block_kb). ParseError on bad input.
// A PYTORCH_CUDA_ALLOC_CONF value pasted as it is parses: PyTorch's per_process_memory_fraction
// maps to memory_cap_fraction with PyTorch's meaning (1 no cap, 0 a cap no reservation fits; for
// memory_cap_fraction 0 is no cap), garbage_collection_threshold is refused outside (0, 1) as
// PyTorch refuses it, and its keys stowage has no knob for (roundup_power2_divisions,
// backend, pinned_*, ...) are ignored, each with a line in `warnings` (when given) saying so.
AllocatorOptions parse_allocator_options(const std::string& text, AllocatorOptions base = {},
                                         std::vector<std::string>* warnings = nullptr);

}  // namespace stowage
