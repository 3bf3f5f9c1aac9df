#include "tools/inspect/pytorch_snapshot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string_view>

#include "stowage/error.hpp"
#include "tools/common/json_input.hpp"
#include "tools/inspect/pytorch_blocks.hpp"
#include "tools/inspect/snapshot_analysis.hpp"

namespace stowage::inspect {

namespace {

const nlohmann::json& array_at(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object()) throw ParseError(fmt::format("{}: expected a dict", where));
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) throw ParseError(fmt::format("{}.{}: expected a list", where, key));
  return *it;
}

// PyTorch writes integers (Python ints) in every integer field: a float there is refused rather
// than truncated (or rounded, past 2^53).
std::int64_t int_at(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object()) throw ParseError(fmt::format("{}: expected a dict", where));
  const auto it = j.find(key);
  if (it == j.end()) throw ParseError(fmt::format("{}: field '{}' is missing", where, key));
  if (it->is_number_float())
    throw ParseError(fmt::format("{}: field '{}' is {}, not an integer", where, key, it->dump()));
  return tools::get_int(j, key, where);
}
std::int64_t int_or(const nlohmann::json& j, const char* key, std::int64_t fallback, const std::string& where) {
  return j.is_object() && j.contains(key) ? int_at(j, key, where) : fallback;
}

std::uint64_t unsigned_at(const nlohmann::json& j, const char* key, const std::string& where) {
  const std::int64_t v = int_at(j, key, where);
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
// An OOM's size is the request that failed (torch.empty(2**47) asks for 512 TiB): reported, never
// summed, so any size_t PyTorch writes is taken.
std::uint64_t request_at(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : unsigned_at(j, key, where);
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

// PyTorch's _frame_filter (torch/cuda/_memory_viz.py): the frames memory_viz leaves out of a
// stack (the unwinder, the dispatcher, the interpreter).
bool frame_shown(const std::string& name, const std::string& filename) {
  static constexpr std::string_view omit_functions[] = {"unwind::unwind",    "CapturedTraceback::gather",
                                                        "gather_with_cpp",   "_start",
                                                        "__libc_start_main", "PyEval_",
                                                        "PyObject_",         "PyFunction_"};
  static constexpr std::string_view omit_filenames[] = {"core/boxing",
                                                        "/Register",
                                                        "/Redispatch",
                                                        "pythonrun.c",
                                                        "Modules/main.c",
                                                        "Objects/call.c",
                                                        "Objects/methodobject.c",
                                                        "pycore_ceval.h",
                                                        "ceval.c",
                                                        "cpython/abstract.h"};
  for (auto of : omit_functions)
    if (name.find(of) != std::string::npos) return false;
  for (auto of : omit_filenames)
    if (filename.find(of) != std::string::npos) return false;
  return true;
}

// The frame that names a block (innermost first, as PyTorch lists them): stowage's tag frame
// anywhere; else the first Python frame memory_viz shows; else the first frame it shows; else
// the innermost. With stacks="all" the innermost is always the unwinder itself.
std::optional<std::size_t> tag_frame(std::size_t count, const std::function<const nlohmann::json&(std::size_t)>& item) {
  if (count == 0) return std::nullopt;
  std::optional<std::size_t> python, shown;
  for (std::size_t i = 0; i < count; ++i) {
    const nlohmann::json& f = item(i);
    if (!f.is_object()) continue;
    const std::string file = frame_string(f, "filename", "");
    if (file == kTagFrameFile) return i;
    if (python || !frame_shown(frame_string(f, "name", ""), file)) continue;
    if (!shown) shown = i;
    if (file.size() >= 3 && file.compare(file.size() - 3, 3, ".py") == 0) python = i;
  }
  return python ? python : shown ? shown : std::optional<std::size_t>(0);
}

std::string tag_of(const nlohmann::json& entry) {
  const auto it = entry.find("frames");
  if (it == entry.end() || !it->is_array() || it->empty()) return "";
  const auto i = tag_frame(it->size(), [&](std::size_t k) -> const nlohmann::json& { return (*it)[k]; });
  const auto& f = (*it)[*i];
  if (!f.is_object()) return "";
  if (frame_string(f, "filename", "") == kTagFrameFile) return frame_string(f, "name", "");
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
  else if (s == "segment_alloc" || s == "segment_map") out = TraceAction::segment_map;  // classic or expandable
  else if (s == "segment_free" || s == "segment_unmap") out = TraceAction::segment_unmap;
  else if (s == "oom") out = TraceAction::oom;
  else return false;  // "snapshot" and what later versions add: not memory changes
  return true;
}

// Whether the reader takes a trace entry: one that changes memory, or one it refuses (so that a
// malformed entry is reported, not skipped with its device).
bool entry_read(const nlohmann::json& e) {
  if (!e.is_object()) return true;
  const auto it = e.find("action");
  TraceAction action{};
  return it != e.end() && !it->is_null() && (!it->is_string() || trace_action(it->get<std::string>(), action));
}

// history[0] of a block in PyTorch 2.0's and 1.13's form (no "frames", a "history" list), else null.
const nlohmann::json* legacy_history(const nlohmann::json& block) {
  if (!block.is_object() || block.contains("frames")) return nullptr;
  const auto it = block.find("history");
  if (it == block.end() || !it->is_array() || it->empty() || !(*it)[0].is_object()) return nullptr;
  return &(*it)[0];
}

void add(StatArray& a, Pool pool, std::int64_t n) {
  a.all.current += n;
  (pool == Pool::small ? a.small_pool : a.large_pool).current += n;
}

}  // namespace

bool is_pytorch_snapshot(const nlohmann::json& j) {
  return j.is_object() && j.contains("segments") && j.contains("device_traces") && !j.contains("version");
}

const ListSelector& pytorch_frames_selector() {
  static const ListSelector selector{"frames", [](std::size_t count, const auto& item) {
                                       std::vector<std::size_t> keep;
                                       if (const auto i = tag_frame(count, item)) keep.push_back(*i);
                                       return keep;
                                     }};
  return selector;
}

nlohmann::json read_pytorch_pickle(std::string_view data, const std::string& what) {
  return read_pickle(data, what, &pytorch_frames_selector());
}

std::vector<int> pytorch_devices(const nlohmann::json& j, const std::string& what, std::vector<int>* skipped) {
  if (j.is_array())
    return pytorch_devices({{"segments", j}, {"device_traces", nlohmann::json::array()}}, what, skipped);
  if (!j.is_object())
    throw ParseError(
        fmt::format("{}: expected a dict with \"segments\" and \"device_traces\" (or a list of segments)", what));
  const nlohmann::json& segments = array_at(j, "segments", what);
  const nlohmann::json& traces = array_at(j, "device_traces", what);
  std::set<int> devices;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const std::string where = fmt::format("{}.segments[{}]", what, i);
    const auto d = int_or(segments[i], "device", 0, where);
    if (d < 0 || d > kMaxDevice) throw ParseError(fmt::format("{}: device {} is out of range", where, d));
    devices.insert(int(d));
  }
  for (std::size_t d = 0; d < traces.size() && d <= std::size_t(kMaxDevice); ++d) {
    if (!traces[d].is_array() || traces[d].empty() || devices.contains(int(d))) continue;
    if (std::any_of(traces[d].begin(), traces[d].end(), entry_read)) devices.insert(int(d));
    else if (skipped) skipped->push_back(int(d));
  }
  return {devices.begin(), devices.end()};
}

Snapshot snapshot_from_pytorch(const nlohmann::json& j, const std::string& what, int device) {
  // A bare list of segments is an older form that PyTorch's own reader still takes
  // (_memory_viz._read: {'segments': data, 'traces': []}).
  if (j.is_array())
    return snapshot_from_pytorch({{"segments", j}, {"device_traces", nlohmann::json::array()}}, what, device);
  if (device < 0) {
    std::vector<int> skipped;
    const std::vector<int> devices = pytorch_devices(j, what, &skipped);
    device = !devices.empty() ? devices.front() : !skipped.empty() ? skipped.front() : 0;
  }
  const nlohmann::json& segments = array_at(j, "segments", what);
  const nlohmann::json& traces = array_at(j, "device_traces", what);

  Snapshot s;  // capacity stays 0, unknown: PyTorch's snapshot does not hold the device's memory
  s.device = device;
  s.device_name = fmt::format("cuda:{} (PyTorch snapshot)", device);
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const nlohmann::json& seg = segments[i];
    const std::string where = fmt::format("{}.segments[{}]", what, i);
    if (int_or(seg, "device", 0, where) != device) continue;
    SegmentInfo info;
    info.address = unsigned_at(seg, "address", where);
    info.total_size = bytes_at(seg, "total_size", where);
    info.stream = Stream{static_cast<std::uintptr_t>(int_or(seg, "stream", 0, where))};
    info.pool = tools::get_string_or(seg, "segment_type", "large", where) == "small" ? Pool::small : Pool::large;
    info.expandable = tools::get_bool_or(seg, "is_expandable", false, where);
    const nlohmann::json& blocks = array_at(seg, "blocks", where);
    std::uintptr_t next = info.address;  // older versions give no block addresses: they tile the segment
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      const std::string bw = fmt::format("{}.blocks[{}]", where, k);
      BlockInfo b;
      b.address = blocks[k].is_object() && blocks[k].contains("address") ? unsigned_at(blocks[k], "address", bw) : next;
      b.size = bytes_at(blocks[k], "size", bw);
      b.state = block_state(tools::get_string_or(blocks[k], "state", "", bw), bw);
      b.stream = info.stream;
      // PyTorch 2.0 and 1.13 keep frames and the requested size in history[0] (as
      // _memory_viz._block_extra_legacy reads them).
      const nlohmann::json* history = legacy_history(blocks[k]);
      b.tag = tag_of(history ? *history : blocks[k]);
      // A free block's requested size is stale (an earlier allocation's): 0, as stowage's.
      if (b.state == BlockState::inactive) b.requested_size = 0;
      else if (blocks[k].contains("requested_size")) b.requested_size = bytes_at(blocks[k], "requested_size", bw);
      else if (history && history->contains("real_size"))
        b.requested_size = bytes_at(*history, "real_size", bw + ".history[0]");
      else b.requested_size = b.size;
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
    s.segments.push_back(std::move(info));
  }
  PyTorchBlockRules rules = pytorch_block_rules(j);
  std::vector<std::uint64_t> requested;  // the trace's sizes as PyTorch wrote them
  if (std::size_t(device) < traces.size() && traces[std::size_t(device)].is_array()) {
    const nlohmann::json& trace = traces[std::size_t(device)];
    for (std::size_t i = 0; i < trace.size(); ++i) {
      const std::string where = fmt::format("{}.device_traces[{}][{}]", what, device, i);
      TraceEntry t;
      const std::string action = tools::get_string_or(trace[i], "action", "", where);
      if (!trace_action(action, t.action)) continue;
      rules.expandable |= action == "segment_map" || action == "segment_unmap";
      // An OOM has no address: PyTorch writes the device's free bytes in its place.
      t.address = unsigned_at(trace[i], t.action == TraceAction::oom ? "device_free" : "addr", where);
      t.size = t.action == TraceAction::oom ? request_at(trace[i], "size", where) : bytes_at(trace[i], "size", where);
      t.stream = Stream{static_cast<std::uintptr_t>(int_or(trace[i], "stream", 0, where))};
      const std::int64_t us = int_or(trace[i], "time_us", 0, where);
      t.time_ns = us > INT64_MAX / 1000 ? INT64_MAX : us < INT64_MIN / 1000 ? INT64_MIN : us * 1000;
      t.tag = tag_of(trace[i]);
      if (t.action == TraceAction::oom) ++s.stats.num_ooms;
      requested.push_back(t.size);
      s.trace.push_back(std::move(t));
    }
  }
  to_block_sizes(s, requested, rules);
  // No counters in PyTorch's snapshot: a peak is the trace's highest point (shifted so the
  // trace ends at now), at least now.
  const std::vector<std::int64_t> along = allocated_along(s.trace);
  std::int64_t reserved = 0, high_alloc = 0, high_reserved = 0;
  for (std::size_t i = 0; i < s.trace.size(); ++i) {
    const auto& t = s.trace[i];
    const auto n = std::int64_t(std::min<std::size_t>(t.size, INT64_MAX / 2));
    if (t.action == TraceAction::segment_map) reserved += n;
    if (t.action == TraceAction::segment_unmap) reserved -= n;
    high_alloc = std::max(high_alloc, along[i]);
    high_reserved = std::max(high_reserved, reserved);
  }
  const std::int64_t alloc = along.empty() ? 0 : along.back();
  for (StatArray* a : {&s.stats.allocated_bytes, &s.stats.reserved_bytes, &s.stats.active_bytes,
                       &s.stats.requested_bytes, &s.stats.allocation, &s.stats.segment})
    for (Stat* st : {&a->all, &a->small_pool, &a->large_pool}) st->peak = st->allocated = st->current;
  s.stats.allocated_bytes.all.peak =
      std::max(s.stats.allocated_bytes.all.current, s.stats.allocated_bytes.all.current - alloc + high_alloc);
  s.stats.reserved_bytes.all.peak =
      std::max(s.stats.reserved_bytes.all.current, s.stats.reserved_bytes.all.current - reserved + high_reserved);
  return s;
}

}  // namespace stowage::inspect
