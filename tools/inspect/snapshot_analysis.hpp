#pragma once
// What a snapshot says about where memory went: peaks, fragmentation over the trace, the
// largest blocks, and the tags that owned the most bytes at the peak.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "stowage/allocator.hpp"

namespace stowage::inspect {

struct TimelinePoint {
  std::int64_t time_ns = 0;    // the trace event's (the first point: the first event's)
  std::int64_t events = 0;     // trace events applied: 0 is the state before the first
  std::int64_t allocated = 0;  // bytes in allocated blocks
  std::int64_t reserved = 0;   // bytes mapped from the device
  double fragmentation() const { return reserved > 0 ? 1.0 - double(allocated) / double(reserved) : 0.0; }
};

struct BlockSummary {
  std::uintptr_t address = 0;
  std::int64_t size = 0;
  std::int64_t requested = 0;
  std::string state;
  std::string tag;
};

struct TagBytes {
  std::string tag;  // "(untagged)" for "", "(before trace)" for blocks allocated before the window
  std::int64_t bytes = 0;
};

// Where a training step begins on the timeline: the first traced event whose tag names a step
// other than the one before (docs/snapshot.md, "Step marks").
struct StepMark {
  std::int64_t time_ns = 0;
  std::int64_t events = 0;  // as TimelinePoint::events: the point after that event
  std::int64_t step = 0;
};

// An allocation that failed: the request is reported only (it may exceed any device).
struct OomSummary {
  std::int64_t time_ns = 0;
  std::int64_t events = 0;        // as TimelinePoint::events: the point after it
  std::uint64_t requested = 0;    // bytes asked for
  std::uint64_t device_free = 0;  // PyTorch's device_free; 0 in stowage's snapshots
  std::string tag;
};

struct SnapshotAnalysis {
  int device = 0;
  std::string device_name;
  // The device's memory; 0 when the snapshot does not say (PyTorch's).
  std::int64_t capacity = 0;
  std::int64_t allocated = 0, reserved = 0;            // now (stats)
  std::int64_t peak_allocated = 0, peak_reserved = 0;  // since the last reset (stats)
  std::int64_t segments = 0, num_ooms = 0;
  double fragmentation = 0;                  // 1 − allocated / reserved now
  std::int64_t largest_free = 0;             // largest inactive block
  std::vector<BlockSummary> largest_blocks;  // allocated blocks, largest first
  std::vector<TagBytes> tags_now;            // allocated bytes per tag now, most first (add up to allocated)
  std::vector<TagBytes> tags_at_peak;        // per tag at the trace's allocated peak
  std::vector<int> devices;                  // devices in the snapshot's file (set by the command)
  std::vector<int> skipped_devices;          // in the file without memory (set by the command)
  std::vector<TimelinePoint> timeline;       // from the trace: its start, then after each event
  std::int64_t trace_events = 0;
  bool trace_timed = false;               // a trace event has a time (PyTorch's before ~2.1: none)
  std::int64_t trace_peak_allocated = 0;  // the highest point of the timeline
  double fragmentation_at_peak = 0;       // 1 − allocated / reserved there
  std::int64_t largest_gap = 0;           // most reserved − allocated bytes along the trace
  std::vector<StepMark> steps;            // step marks along the trace, oldest first
  std::vector<OomSummary> ooms;           // the trace's last `top` OOMs, oldest first
};

// The step a tag names, or -1: "step" in any case, then optionally one of ' ', '_', '-', ':', '=',
// '#', then decimal digits, then the end of the tag or '/', '.' or ':' and anything
// ("step 3", "step_12/attn", "Step:7.fwd"). "step 3 (train.py:10)", a PyTorch frame, names none.
std::int64_t step_of_tag(std::string_view tag);

// Allocated bytes after each trace entry, from 0 at the start. Bytes count from an alloc to its
// free_requested, as the allocators' allocated_bytes do (a block pending free on another stream
// is no longer allocated); a free_completed counts only for an allocation whose request the
// trace lacks. A free_requested for a block allocated before the trace counts too.
std::vector<std::int64_t> allocated_along(const std::vector<TraceEntry>& trace);

// `top` bounds largest_blocks, the tag lists and ooms.
SnapshotAnalysis analyze(const Snapshot& snapshot, std::size_t top = 10);

// Reads a snapshot file, one Snapshot per device it holds, lowest first (stowage's holds one; a
// PyTorch snapshot those pytorch_devices gives, at least one; the others go to `skipped`): bounded
// in size and nesting, then checked for consistency (snapshot_consistency.hpp). ParseError naming
// the file (and the device, when several) and the position, field or problem.
std::vector<Snapshot> load_snapshots(const std::string& path, std::vector<int>* skipped = nullptr);
// The lowest device's.
Snapshot load_snapshot(const std::string& path);

}  // namespace stowage::inspect
