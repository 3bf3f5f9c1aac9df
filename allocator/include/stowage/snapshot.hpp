#pragma once
// A snapshot of a caching allocator: its statistics, segments, blocks and recent trace; and its
// JSON form (docs/snapshot.md).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "stowage/allocator_stats.hpp"
#include "stowage/device.hpp"

namespace stowage {

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

// Snapshot as JSON (format: docs/snapshot.md), and back: ParseError naming the field for
// malformed input (wrong types, numbers out of range, text over kMaxSnapshotJsonBytes or nested
// deeper than the format).
inline constexpr std::size_t kMaxSnapshotJsonBytes = std::size_t{512} << 20;
std::string to_json(const Snapshot& snapshot);
Snapshot snapshot_from_json(const std::string& text);

const char* to_string(BlockState s);
const char* to_string(TraceAction a);

}  // namespace stowage
