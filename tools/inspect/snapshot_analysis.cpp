#include "tools/inspect/snapshot_analysis.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "stowage/error.hpp"
#include "tools/common/json_input.hpp"
#include "tools/inspect/pickle_reader.hpp"
#include "tools/inspect/pytorch_snapshot.hpp"
#include "tools/inspect/snapshot_consistency.hpp"

namespace stowage::inspect {

namespace {

std::vector<TagBytes> top_tags(const std::map<std::string, std::int64_t>& bytes, std::size_t top) {
  std::vector<TagBytes> out;
  for (const auto& [tag, b] : bytes)
    if (b > 0) out.push_back({tag.empty() ? "(untagged)" : tag, b});
  std::stable_sort(out.begin(), out.end(), [](const TagBytes& a, const TagBytes& b) { return a.bytes > b.bytes; });
  if (out.size() > top) out.resize(top);
  return out;
}

std::int64_t as_bytes(std::size_t v) { return static_cast<std::int64_t>(std::min<std::size_t>(v, INT64_MAX)); }

// Replays allocated bytes entry by entry (see allocated_along), optionally per tag.
class AllocatedReplay {
 public:
  void step(const TraceEntry& t, std::map<std::string, std::int64_t>* tags) {
    const std::int64_t size = as_bytes(t.size);
    if (t.action == TraceAction::alloc) {
      live_[t.address] = {size, &t.tag, false};
      bytes_ += size;
      if (tags) (*tags)[t.tag] += size;
    } else if (t.action == TraceAction::free_requested || t.action == TraceAction::free_completed) {
      const auto it = live_.find(t.address);
      if (it == live_.end()) {
        // Allocated before the trace: its request ends it (a completion's request came before).
        if (t.action == TraceAction::free_requested) bytes_ -= size;
        return;
      }
      if (!it->second.requested) {
        bytes_ -= it->second.size;
        if (tags) (*tags)[*it->second.tag] -= it->second.size;
        it->second.requested = true;
      }
      if (t.action == TraceAction::free_completed) live_.erase(it);
    }
  }
  std::int64_t bytes() const { return bytes_; }

 private:
  struct Live {
    std::int64_t size;
    const std::string* tag;
    bool requested;
  };
  std::unordered_map<std::uintptr_t, Live> live_;
  std::int64_t bytes_ = 0;
};

}  // namespace

std::vector<std::int64_t> allocated_along(const std::vector<TraceEntry>& trace) {
  std::vector<std::int64_t> out;
  out.reserve(trace.size());
  AllocatedReplay replay;
  for (const auto& t : trace) {
    replay.step(t, nullptr);
    out.push_back(replay.bytes());
  }
  return out;
}

std::int64_t step_of_tag(std::string_view tag) {
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
  if (tag.size() < 5) return -1;
  for (std::size_t i = 0; i < 4; ++i)
    if (lower(tag[i]) != "step"[i]) return -1;
  std::size_t i = 4;
  if (std::string_view(" _-:=#").find(tag[i]) != std::string_view::npos) ++i;
  const std::size_t digits = i;
  std::int64_t n = 0;
  for (; i < tag.size() && tag[i] >= '0' && tag[i] <= '9'; ++i) {
    if (i - digits >= 18) return -1;  // beyond any step count, and int64
    n = n * 10 + (tag[i] - '0');
  }
  if (i == digits) return -1;
  if (i < tag.size() && tag[i] != '/' && tag[i] != '.' && tag[i] != ':') return -1;
  return n;
}

SnapshotAnalysis analyze(const Snapshot& s, std::size_t top) {
  SnapshotAnalysis a;
  a.device = s.device;
  a.device_name = s.device_name;
  a.capacity = as_bytes(s.capacity);
  a.allocated = s.stats.allocated_bytes.all.current;
  a.reserved = s.stats.reserved_bytes.all.current;
  a.peak_allocated = s.stats.allocated_bytes.all.peak;
  a.peak_reserved = s.stats.reserved_bytes.all.peak;
  a.segments = static_cast<std::int64_t>(s.segments.size());
  a.num_ooms = s.stats.num_ooms;
  a.fragmentation = a.reserved > 0 ? 1.0 - double(a.allocated) / double(a.reserved) : 0.0;

  std::map<std::string, std::int64_t> now;
  for (const auto& seg : s.segments)
    for (const auto& b : seg.blocks) {
      if (b.state == BlockState::inactive) {
        a.largest_free = std::max(a.largest_free, as_bytes(b.size));
        continue;
      }
      a.largest_blocks.push_back({b.address, as_bytes(b.size), as_bytes(b.requested_size), to_string(b.state), b.tag});
      // Allocated bytes only, as `allocated` counts them: a block pending free is not.
      if (b.state == BlockState::active_allocated) now[b.tag] += as_bytes(b.size);
    }
  std::stable_sort(a.largest_blocks.begin(), a.largest_blocks.end(),
                   [](const BlockSummary& x, const BlockSummary& y) { return x.size > y.size; });
  if (a.largest_blocks.size() > top) a.largest_blocks.resize(top);
  a.tags_now = top_tags(now, top);

  // The trace is a ring: it may begin mid-run. Deltas are replayed forward from 0, then shifted
  // so the last point equals the snapshot's current allocated/reserved bytes: the first point is
  // the state before the first event (now, with the trace's events undone). One pass finds the
  // peak, a second replays up to it for the tags there: linear in the trace.
  if (s.trace.empty()) return a;
  a.trace_events = static_cast<std::int64_t>(s.trace.size());
  std::int64_t reserved = 0;
  std::size_t peak_index = 0;
  std::int64_t step = -1;
  a.timeline.reserve(s.trace.size() + 1);
  a.timeline.push_back({s.trace.front().time_ns, 0, 0, 0});
  AllocatedReplay replay;
  for (const auto& t : s.trace) {
    const auto events = static_cast<std::int64_t>(a.timeline.size());
    if (const std::int64_t n = step_of_tag(t.tag); n >= 0 && n != step) {
      a.steps.push_back({t.time_ns, events, n});
      step = n;
    }
    a.trace_timed |= t.time_ns != 0;
    if (t.action == TraceAction::oom) a.ooms.push_back({t.time_ns, events, t.size, t.address, t.tag});
    const std::int64_t size = as_bytes(t.size);
    if (t.action == TraceAction::segment_map) reserved += size;
    if (t.action == TraceAction::segment_unmap) reserved -= size;
    replay.step(t, nullptr);
    a.timeline.push_back({t.time_ns, events, replay.bytes(), reserved});
    if (replay.bytes() > a.timeline[peak_index].allocated) peak_index = a.timeline.size() - 1;
  }
  if (a.ooms.size() > top) a.ooms.erase(a.ooms.begin(), a.ooms.end() - static_cast<std::ptrdiff_t>(top));
  std::map<std::string, std::int64_t> at_peak;
  AllocatedReplay to_peak;
  for (std::size_t i = 0; i < peak_index; ++i) to_peak.step(s.trace[i], &at_peak);
  const std::int64_t da = a.allocated - a.timeline.back().allocated, dr = a.reserved - a.timeline.back().reserved;
  for (auto& p : a.timeline) {
    p.allocated += da;
    p.reserved += dr;
    a.largest_gap = std::max(a.largest_gap, p.reserved - p.allocated);
  }
  a.trace_peak_allocated = a.timeline[peak_index].allocated;
  a.fragmentation_at_peak = a.timeline[peak_index].fragmentation();
  std::int64_t traced = 0;
  for (const auto& [tag, b] : at_peak) traced += b;
  if (a.trace_peak_allocated > traced) at_peak["(before trace)"] += a.trace_peak_allocated - traced;
  a.tags_at_peak = top_tags(at_peak, top);
  return a;
}

std::vector<Snapshot> load_snapshots(const std::string& path, std::vector<int>* skipped) {
  const std::string text = tools::read_file(path);  // bounded size; each reader bounds the depth
  auto stowage_snapshot = [&] {
    try {
      return std::vector<Snapshot>{snapshot_from_json(text)};
    } catch (const ParseError& e) {
      throw ParseError(fmt::format("{}: {}", path, e.what()));
    }
  };
  auto pytorch = [&](const nlohmann::json& j) {
    std::vector<int> others;
    std::vector<int> devices = pytorch_devices(j, path, &others);
    if (devices.empty()) {  // none holds memory: the lowest stands for the file
      devices.push_back(others.empty() ? 0 : others.front());
      if (!others.empty()) others.erase(others.begin());
    }
    if (skipped) *skipped = std::move(others);
    std::vector<Snapshot> out;
    out.reserve(devices.size());
    for (int d : devices) out.push_back(snapshot_from_pytorch(j, path, d));
    return out;
  };
  std::vector<Snapshot> snapshots;
  if (!text.empty() && static_cast<unsigned char>(text[0]) == 0x80) {  // a pickle's PROTO opcode
    snapshots = pytorch(read_pytorch_pickle(text, path));
  } else if (!text.empty() && std::string_view("(}])").find(text[0]) != std::string_view::npos && text.back() == '.') {
    // Protocols 0 and 1 have no PROTO opcode; no JSON starts this way.
    throw ParseError(
        fmt::format("{}: a pickle of protocol 0 or 1, which is not supported (2 to 5 are read; "
                    "torch.cuda.memory._dump_snapshot writes Python's default, 4 or later)",
                    path));
  } else if (const auto first = text.find_first_not_of(" \t\r\n"); first != std::string::npos && text[first] == '[') {
    // A bare list of segments (torch.cuda.memory_snapshot()) as JSON: PyTorch's older form, as in
    // a pickle; stowage's own snapshot is an object.
    snapshots = pytorch(tools::parse_json(text, path));
  } else if (text.find("\"device_traces\"") != std::string::npos) {  // PyTorch's dict as JSON?
    const nlohmann::json j = tools::parse_json(text, path);
    snapshots = is_pytorch_snapshot(j) ? pytorch(j) : stowage_snapshot();
  } else {
    snapshots = stowage_snapshot();
  }
  for (const Snapshot& snapshot : snapshots) {
    const auto broken = inconsistencies(snapshot);
    if (broken.empty()) continue;
    std::string list;
    for (std::size_t i = 0; i < broken.size() && i < 5; ++i) list += "\n  " + broken[i];
    const std::string device = snapshots.size() > 1 ? fmt::format(" cuda:{}:", snapshot.device) : "";
    throw ParseError(fmt::format("{}:{} not a consistent snapshot ({} problem{}):{}{}", path, device, broken.size(),
                                 broken.size() == 1 ? "" : "s", list, broken.size() > 5 ? "\n  ..." : ""));
  }
  return snapshots;
}

Snapshot load_snapshot(const std::string& path) { return std::move(load_snapshots(path).front()); }

}  // namespace stowage::inspect
