#pragma once
// stowage Snapshots written in PyTorch's snapshot form, for pytorch.org/memory_viz and
// torch.cuda._memory_viz (`stowage inspect --to-memory-viz`).
#include <nlohmann/json.hpp>

#include <vector>

#include "stowage/snapshot.hpp"

namespace stowage::inspect {

// memory_viz's name for entries without a category: untagged blocks and entries carry it.
inline constexpr const char* kUnknownCategory = "unknown";

// PyTorch's form of `snapshot`: segments with blocks, and the trace as device_traces[device]
// (times in microseconds; segment_alloc/segment_free for classic segments, segment_map/
// segment_unmap for expandable ones; device_free for an OOM); every block and trace entry
// carries its tag as a frame and as "category" ("unknown" when untagged). When every trace entry
// is tagged, the trace ends with PyTorch's "snapshot" marker, untagged, so that memory_viz finds
// an 'unknown' category. A free block's requested size is written as 0.
nlohmann::json to_pytorch(const Snapshot& snapshot);

// Several devices' snapshots in one: every device's segments, each trace at its device's index.
nlohmann::json to_pytorch(const std::vector<Snapshot>& devices);

}  // namespace stowage::inspect
