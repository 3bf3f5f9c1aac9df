#include "tools/inspect/pytorch_export.hpp"

#include <algorithm>

#include "tools/inspect/pytorch_snapshot.hpp"

namespace stowage::inspect {

nlohmann::json to_pytorch(const Snapshot& s) {
  auto frames = [](const std::string& tag) {
    nlohmann::json f = nlohmann::json::array();
    if (!tag.empty()) f.push_back({{"filename", kTagFrameFile}, {"line", 0}, {"name", tag}});
    return f;
  };
  auto category = [](const std::string& tag) { return tag.empty() ? std::string(kUnknownCategory) : tag; };
  auto state = [](BlockState b) {
    return b == BlockState::active_allocated      ? "active_allocated"
           : b == BlockState::active_pending_free ? "active_pending_free"
                                                  : "inactive";
  };
  // PyTorch reports an expandable segment as one segment per contiguous mapped run (its blocks
  // tile each), as memory_viz draws them; stowage's lists the runs in one, holes unlisted.
  nlohmann::json segments = nlohmann::json::array();
  auto add_segment = [&](const SegmentInfo& seg, std::size_t first, std::size_t last) {
    nlohmann::json blocks = nlohmann::json::array();
    std::uint64_t total = 0, allocated = 0, active = 0, requested = 0;
    for (std::size_t k = first; k < last; ++k) {
      const BlockInfo& b = seg.blocks[k];
      total += b.size;
      if (b.state != BlockState::inactive) active += b.size;
      if (b.state == BlockState::active_allocated) {
        allocated += b.size;
        requested += b.requested_size;
      }
      blocks.push_back({{"address", b.address},
                        {"size", b.size},
                        {"requested_size", b.state == BlockState::inactive ? 0 : b.requested_size},
                        {"state", state(b.state)},
                        {"frames", frames(b.tag)},
                        {"category", category(b.tag)}});
    }
    const bool whole = !seg.expandable;
    segments.push_back({{"device", s.device},
                        {"address", whole ? seg.address : seg.blocks[first].address},
                        {"total_size", whole ? seg.total_size : total},
                        {"allocated_size", whole ? seg.allocated_size : allocated},
                        {"active_size", whole ? seg.active_size : active},
                        {"requested_size", requested},
                        {"stream", static_cast<std::int64_t>(seg.stream)},
                        {"segment_type", seg.pool == Pool::small ? "small" : "large"},
                        {"segment_pool_id", {0, 0}},
                        {"is_expandable", seg.expandable},
                        {"frames", nlohmann::json::array()},
                        {"blocks", std::move(blocks)}});
  };
  for (const auto& seg : s.segments) {
    if (!seg.expandable) {
      add_segment(seg, 0, seg.blocks.size());
      continue;
    }
    // One segment per run; none when nothing is mapped, as in PyTorch's.
    for (std::size_t first = 0, k = 1; first < seg.blocks.size(); ++k)
      if (k == seg.blocks.size() || seg.blocks[k].address != seg.blocks[k - 1].address + seg.blocks[k - 1].size) {
        add_segment(seg, first, k);
        first = k;
      }
  }
  // PyTorch names a classic segment's events segment_alloc/segment_free (cudaMalloc, cudaFree)
  // and only an expandable one's segment_map/segment_unmap; memory_viz and _memory_viz.trace()
  // know classic segments by the former. An event inside a segment of the snapshot takes its
  // kind; one outside every segment (since released) the kind the snapshot's segments have.
  bool any_expandable = false;
  for (const auto& seg : s.segments) any_expandable |= seg.expandable;
  auto expandable_at = [&](std::uintptr_t address) {
    for (const auto& seg : s.segments) {
      const std::uintptr_t end = seg.expandable && !seg.blocks.empty()
                                     ? seg.blocks.back().address + seg.blocks.back().size
                                     : seg.address + seg.total_size;
      if (address >= seg.address && address < end) return seg.expandable;
    }
    return any_expandable;
  };
  nlohmann::json trace = nlohmann::json::array();
  for (const auto& t : s.trace) {
    const bool segment = t.action == TraceAction::segment_map || t.action == TraceAction::segment_unmap;
    const bool expandable = segment && expandable_at(t.address);
    const char* action = t.action == TraceAction::alloc            ? "alloc"
                         : t.action == TraceAction::free_requested ? "free_requested"
                         : t.action == TraceAction::free_completed ? "free_completed"
                         : t.action == TraceAction::segment_map    ? (expandable ? "segment_map" : "segment_alloc")
                         : t.action == TraceAction::segment_unmap  ? (expandable ? "segment_unmap" : "segment_free")
                                                                   : "oom";
    // An OOM's address slot holds the device's free bytes, under PyTorch's name for them.
    trace.push_back({{"action", action},
                     {t.action == TraceAction::oom ? "device_free" : "addr", t.address},
                     {"size", t.size},
                     {"stream", static_cast<std::int64_t>(t.stream)},  // PyTorch's are int64: any stream is -1
                     {"time_us", t.time_ns / 1000},
                     {"frames", frames(t.tag)},
                     {"category", category(t.tag)}});
  }
  // memory_viz's annotate_snapshot throws (`snapshot.categores.push('unknown')`, a typo) when the
  // trace has categories and none is 'unknown': with every entry tagged, the trace ends with the
  // marker PyTorch records at each snapshot() (its size the active bytes), untagged.
  const bool all_tagged =
      !s.trace.empty() && std::none_of(s.trace.begin(), s.trace.end(), [](const auto& t) { return t.tag.empty(); });
  if (all_tagged) {
    std::uint64_t active = 0;
    for (const auto& seg : s.segments) active += seg.active_size;
    trace.push_back({{"action", "snapshot"},
                     {"addr", 0},
                     {"size", active},
                     {"stream", 0},
                     {"time_us", s.trace.back().time_ns / 1000},
                     {"frames", nlohmann::json::array()},
                     {"category", kUnknownCategory}});
  }
  nlohmann::json traces = nlohmann::json::array();
  for (int d = 0; d < s.device; ++d) traces.push_back(nlohmann::json::array());
  traces.push_back(std::move(trace));
  return {{"segments", std::move(segments)}, {"device_traces", std::move(traces)}};
}

nlohmann::json to_pytorch(const std::vector<Snapshot>& devices) {
  nlohmann::json segments = nlohmann::json::array();
  nlohmann::json traces = nlohmann::json::array();
  for (const Snapshot& s : devices) {
    nlohmann::json one = to_pytorch(s);
    for (auto& seg : one["segments"]) segments.push_back(std::move(seg));
    while (traces.size() <= std::size_t(s.device)) traces.push_back(nlohmann::json::array());
    traces[std::size_t(s.device)] = std::move(one["device_traces"][std::size_t(s.device)]);
  }
  return {{"segments", std::move(segments)}, {"device_traces", std::move(traces)}};
}

}  // namespace stowage::inspect
