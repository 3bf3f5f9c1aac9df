#pragma once
// The stream-ordered caching allocator: one instance per device. Everything stowage puts on a
// device comes from here.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stowage/allocator_stats.hpp"
#include "stowage/device.hpp"

namespace stowage {

enum class SegmentMode { classic, expandable };

struct AllocatorOptions {
  // Expandable segments where the device supports virtual memory (else classic).
  SegmentMode segments = SegmentMode::expandable;
  // A cap on reserved bytes: absolute bytes, or a fraction of capacity (0 = none).
  std::size_t memory_cap_bytes = 0;
  double memory_cap_fraction = 0.0;
  // When reserved bytes exceed this fraction of the cap (or capacity), free cached blocks that
  // have not been used recently before growing (0 = off). PyTorch's garbage_collection_threshold.
  double gc_threshold = 0.0;
  // Blocks this large or larger are never split (0 = no limit). PyTorch's max_split_size_mb.
  std::size_t max_split_size = 0;
  // Record a trace of allocator events for snapshots; ring size in events (0 = off).
  std::size_t trace_entries = 0;
  // Reserve this much address space per expandable pool (default: 2x device capacity).
  std::size_t expandable_reserve = 0;
};

// Parses PyTorch-style configuration text, e.g.
// "expandable_segments:True,max_split_size_mb:512,garbage_collection_threshold:0.8",
// plus stowage's keys (memory_cap_mb, memory_cap_fraction, trace_entries). ParseError on bad input.
AllocatorOptions parse_allocator_options(const std::string& text, AllocatorOptions base = {});

// State of a block in a snapshot.
enum class BlockState { active_allocated, active_pending_free, inactive };

struct BlockInfo {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;
  BlockState state = BlockState::inactive;
  Stream stream{};
  std::string tag;
};

struct SegmentInfo {
  std::uintptr_t address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;
  std::size_t active_size = 0;
  Pool pool = Pool::large;
  Stream stream{};
  bool expandable = false;
  std::vector<BlockInfo> blocks;
};

enum class TraceAction { alloc, free_requested, free_completed, segment_map, segment_unmap, oom };

struct TraceEntry {
  TraceAction action = TraceAction::alloc;
  std::uintptr_t address = 0;
  std::size_t size = 0;
  Stream stream{};
  std::int64_t time_ns = 0;  // steady clock
  std::string tag;
};

struct Snapshot {
  int device = 0;
  std::string device_name;
  std::size_t capacity = 0;
  AllocatorStats stats;
  std::vector<SegmentInfo> segments;
  std::vector<TraceEntry> trace;  // oldest first
};

// Sets the tag recorded with every allocation made on this thread while it lives
// (e.g. "layer3.attn"); nests, restoring the outer tag on destruction.
class ScopedTag {
 public:
  explicit ScopedTag(std::string tag);
  ~ScopedTag();
  ScopedTag(const ScopedTag&) = delete;
  ScopedTag& operator=(const ScopedTag&) = delete;
  static const std::string& current();

 private:
  std::string previous_;
};

class CachingAllocator {
 public:
  explicit CachingAllocator(Device& device, AllocatorOptions options = {});
  ~CachingAllocator();  // gives every segment back; live blocks are reported as leaks in the log
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  Device& device() const;
  const AllocatorOptions& options() const;
  SegmentMode segment_mode() const;  // what is in effect (expandable falls back to classic)

  // Memory usable on `stream` at once. bytes == 0 gives nullptr. Throws OutOfMemory.
  void* allocate(std::size_t bytes, Stream stream = kDefaultStream);
  // Returns a block. Reusable on its stream at once, elsewhere after the streams it was
  // recorded on reach this point. InvalidArgument for a foreign pointer or double free.
  void deallocate(void* ptr);
  // The same, checking the size the caller believes the block has (C ABI passes it).
  void deallocate(void* ptr, std::size_t expected_bytes);
  // The block is also used on `stream`: its memory is not reused before `stream` gets there.
  void record_stream(void* ptr, Stream stream);

  // The rounded size of a live block; InvalidArgument for a pointer this allocator did not give.
  std::size_t block_size(const void* ptr) const;
  bool owns(const void* ptr) const;

  // Gives every free segment (or whole free granule) back to the device.
  void empty_cache();
  void set_memory_cap(std::size_t bytes);  // 0 removes the cap
  std::size_t memory_cap() const;

  AllocatorStats stats() const;
  void reset_peak_stats();
  Snapshot snapshot() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Snapshot as JSON (format: docs/snapshot.md), and back: ParseError naming the field for
// malformed input (wrong types, numbers out of range, text over kMaxSnapshotJsonBytes or nested
// deeper than the format).
inline constexpr std::size_t kMaxSnapshotJsonBytes = std::size_t{512} << 20;
std::string to_json(const Snapshot& snapshot);
Snapshot snapshot_from_json(const std::string& text);

const char* to_string(BlockState s);
const char* to_string(TraceAction a);

}  // namespace stowage
