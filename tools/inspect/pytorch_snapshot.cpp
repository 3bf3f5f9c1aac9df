#include "tools/inspect/pytorch_snapshot.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "stowage/error.hpp"
#include "tools/common/json_input.hpp"

namespace stowage::inspect {

namespace {

const nlohmann::json& array_at(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object()) throw ParseError(fmt::format("{}: expected a dict", where));
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) throw ParseError(fmt::format("{}.{}: expected a list", where, key));
  return *it;
}

std::uint64_t unsigned_at(const nlohmann::json& j, const char* key, const std::string& where) {
  const std::int64_t v = tools::get_int(j, key, where);
  if (v < 0) throw ParseError(fmt::format("{}: field '{}' is negative", where, key));
  return static_cast<std::uint64_t>(v);
}

// Sizes beyond any device (256 TiB) are refused, so the sums below cannot overflow.
constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 48;
std::uint64_t bytes_at(const nlohmann::json& j, const char* key, const std::string& where) {
  const std::uint64_t v = unsigned_at(j, key, where);
  if (v > kMaxBytes) throw ParseError(fmt::format("{}: field '{}' is {} bytes, more than 256 TiB", where, key, v));
  return v;
}

// Frames only label a block: a field of the wrong type reads as absent, never as an error.
std::string frame_string(const nlohmann::json& f, const char* key, const char* fallback) {
  const auto it = f.find(key);
  return it != f.end() && it->is_string() ? it->get<std::string>() : fallback;
}

std::string frame_line(const nlohmann::json& f) {
  const auto it = f.find("line");
  return it != f.end() && it->is_number_integer() ? it->dump() : "?";
}

std::string tag_of(const nlohmann::json& entry) {
  const auto it = entry.find("frames");
  if (it == entry.end() || !it->is_array() || it->empty()) return "";
  for (const auto& f : *it)
    if (f.is_object() && frame_string(f, "filename", "") == kTagFrameFile) return frame_string(f, "name", "");
  const auto& f = it->front();
  if (!f.is_object()) return "";
  return fmt::format("{} ({}:{})", frame_string(f, "name", "?"), frame_string(f, "filename", "?"), frame_line(f));
}

BlockState block_state(const std::string& s, const std::string& where) {
  if (s == "active_allocated") return BlockState::active_allocated;
  if (s == "active_pending_free" || s == "active_awaiting_free") return BlockState::active_pending_free;
  if (s == "inactive") return BlockState::inactive;
  throw ParseError(fmt::format("{}.state: unknown value \"{}\"", where, s));
}

bool trace_action(const std::string& s, TraceAction& out) {
  if (s == "alloc") out = TraceAction::alloc;
  else if (s == "free_requested") out = TraceAction::free_requested;
  else if (s == "free_completed") out = TraceAction::free_completed;
  else if (s == "segment_alloc" || s == "segment_map") out = TraceAction::segment_map;
  else if (s == "segment_free" || s == "segment_unmap") out = TraceAction::segment_unmap;
  else if (s == "oom") out = TraceAction::oom;
  else return false;  // "snapshot" and what later versions add: not memory changes
  return true;
}

void add(StatArray& a, Pool pool, std::int64_t n) {
  a.all.current += n;
  (pool == Pool::small ? a.small_pool : a.large_pool).current += n;
}

}  // namespace

bool is_pytorch_snapshot(const nlohmann::json& j) {
  return j.is_object() && j.contains("segments") && j.contains("device_traces") && !j.contains("version");
}

Snapshot snapshot_from_pytorch(const nlohmann::json& j, const std::string& what) {
  const nlohmann::json& segments = array_at(j, "segments", what);
  const nlohmann::json& traces = array_at(j, "device_traces", what);
  // The device: the lowest with segments or trace entries.
  int device = -1;
  for (const auto& seg : segments) {
    const auto d = tools::get_int_or(seg, "device", 0, what + ".segments[]");
    if (d < 0 || d > 1024) throw ParseError(fmt::format("{}.segments[]: device {} is out of range", what, d));
    device = device < 0 ? int(d) : std::min(device, int(d));
  }
  for (std::size_t d = 0; d < traces.size() && (device < 0 || int(d) < device); ++d)
    if (traces[d].is_array() && !traces[d].empty()) device = int(d);
  if (device < 0) device = 0;

  Snapshot s;
  s.device = device;
  s.device_name = fmt::format("cuda:{} (PyTorch snapshot)", device);
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const nlohmann::json& seg = segments[i];
    const std::string where = fmt::format("{}.segments[{}]", what, i);
    if (tools::get_int_or(seg, "device", 0, where) != device) continue;
    SegmentInfo info;
    info.address = unsigned_at(seg, "address", where);
    info.total_size = bytes_at(seg, "total_size", where);
    info.stream = Stream{static_cast<std::uintptr_t>(tools::get_int_or(seg, "stream", 0, where))};
    info.pool = tools::get_string_or(seg, "segment_type", "large", where) == "small" ? Pool::small : Pool::large;
    info.expandable = tools::get_bool_or(seg, "is_expandable", false, where);
    const nlohmann::json& blocks = array_at(seg, "blocks", where);
    std::uintptr_t next = info.address;  // older versions give no block addresses: they tile the segment
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      const std::string bw = fmt::format("{}.blocks[{}]", where, k);
      BlockInfo b;
      b.address = blocks[k].contains("address") ? unsigned_at(blocks[k], "address", bw) : next;
      b.size = bytes_at(blocks[k], "size", bw);
      b.requested_size = blocks[k].contains("requested_size") ? bytes_at(blocks[k], "requested_size", bw) : b.size;
      b.state = block_state(tools::get_string_or(blocks[k], "state", "", bw), bw);
      b.stream = info.stream;
      b.tag = tag_of(blocks[k]);
      next = b.address + b.size;
      if (b.state != BlockState::inactive) {
        info.active_size += b.size;
        add(s.stats.active_bytes, info.pool, std::int64_t(b.size));
      }
      if (b.state == BlockState::active_allocated) {
        info.allocated_size += b.size;
        add(s.stats.allocated_bytes, info.pool, std::int64_t(b.size));
        add(s.stats.requested_bytes, info.pool, std::int64_t(b.requested_size));
        add(s.stats.allocation, info.pool, 1);
      }
      info.blocks.push_back(std::move(b));
    }
    add(s.stats.reserved_bytes, info.pool, std::int64_t(info.total_size));
    add(s.stats.segment, info.pool, 1);
    s.capacity += info.total_size;
    s.segments.push_back(std::move(info));
  }
  if (std::size_t(device) < traces.size() && traces[std::size_t(device)].is_array()) {
    const nlohmann::json& trace = traces[std::size_t(device)];
    for (std::size_t i = 0; i < trace.size(); ++i) {
      const std::string where = fmt::format("{}.device_traces[{}][{}]", what, device, i);
      TraceEntry t;
      if (!trace_action(tools::get_string_or(trace[i], "action", "", where), t.action)) continue;
      t.address = unsigned_at(trace[i], "addr", where);
      t.size = bytes_at(trace[i], "size", where);
      t.stream = Stream{static_cast<std::uintptr_t>(tools::get_int_or(trace[i], "stream", 0, where))};
      const std::int64_t us = tools::get_int_or(trace[i], "time_us", 0, where);
      t.time_ns = us > INT64_MAX / 1000 ? INT64_MAX : us < INT64_MIN / 1000 ? INT64_MIN : us * 1000;
      t.tag = tag_of(trace[i]);
      if (t.action == TraceAction::oom) ++s.stats.num_ooms;
      s.trace.push_back(std::move(t));
    }
  }
  // No counters in PyTorch's snapshot: a peak is the trace's highest point (shifted so the
  // trace ends at now), at least now.
  std::int64_t alloc = 0, reserved = 0, high_alloc = 0, high_reserved = 0;
  for (const auto& t : s.trace) {
    const auto n = std::int64_t(std::min<std::size_t>(t.size, INT64_MAX / 2));
    if (t.action == TraceAction::alloc) alloc += n;
    if (t.action == TraceAction::free_completed) alloc -= n;
    if (t.action == TraceAction::segment_map) reserved += n;
    if (t.action == TraceAction::segment_unmap) reserved -= n;
    high_alloc = std::max(high_alloc, alloc);
    high_reserved = std::max(high_reserved, reserved);
  }
  for (StatArray* a : {&s.stats.allocated_bytes, &s.stats.reserved_bytes, &s.stats.active_bytes,
                       &s.stats.requested_bytes, &s.stats.allocation, &s.stats.segment})
    for (Stat* st : {&a->all, &a->small_pool, &a->large_pool}) st->peak = st->allocated = st->current;
  s.stats.allocated_bytes.all.peak =
      std::max(s.stats.allocated_bytes.all.current, s.stats.allocated_bytes.all.current - alloc + high_alloc);
  s.stats.reserved_bytes.all.peak =
      std::max(s.stats.reserved_bytes.all.current, s.stats.reserved_bytes.all.current - reserved + high_reserved);
  return s;
}

nlohmann::json to_pytorch(const Snapshot& s) {
  auto frames = [](const std::string& tag) {
    nlohmann::json f = nlohmann::json::array();
    if (!tag.empty()) f.push_back({{"filename", kTagFrameFile}, {"line", 0}, {"name", tag}});
    return f;
  };
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
                        {"requested_size", b.requested_size},
                        {"state", state(b.state)},
                        {"frames", frames(b.tag)},
                        {"category", b.tag}});
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
  nlohmann::json trace = nlohmann::json::array();
  for (const auto& t : s.trace) {
    const char* action = t.action == TraceAction::alloc            ? "alloc"
                         : t.action == TraceAction::free_requested ? "free_requested"
                         : t.action == TraceAction::free_completed ? "free_completed"
                         : t.action == TraceAction::segment_map    ? "segment_map"
                         : t.action == TraceAction::segment_unmap  ? "segment_unmap"
                                                                   : "oom";
    trace.push_back({{"action", action},
                     {"addr", t.address},
                     {"size", t.size},
                     {"stream", static_cast<std::int64_t>(t.stream)},  // PyTorch's are int64: any stream is -1
                     {"time_us", t.time_ns / 1000},
                     {"frames", frames(t.tag)},
                     {"category", t.tag}});
  }
  nlohmann::json traces = nlohmann::json::array();
  for (int d = 0; d < s.device; ++d) traces.push_back(nlohmann::json::array());
  traces.push_back(std::move(trace));
  return {{"segments", std::move(segments)}, {"device_traces", std::move(traces)}};
}

}  // namespace stowage::inspect
