// Snapshot <-> JSON (format: docs/snapshot.md). Parsing names the offending field; every
// failure of the JSON library on hostile input becomes a ParseError.
#include <climits>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>

#include "common/json_depth.hpp"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "stowage/snapshot.hpp"

namespace stowage {

using json = nlohmann::ordered_json;

const char* to_string(BlockState s) {
  switch (s) {
    case BlockState::active_allocated: return "active_allocated";
    case BlockState::active_pending_free: return "active_pending_free";
    case BlockState::inactive: return "inactive";
  }
  return "?";
}

const char* to_string(TraceAction a) {
  switch (a) {
    case TraceAction::alloc: return "alloc";
    case TraceAction::free_requested: return "free_requested";
    case TraceAction::free_completed: return "free_completed";
    case TraceAction::segment_map: return "segment_map";
    case TraceAction::segment_unmap: return "segment_unmap";
    case TraceAction::oom: return "oom";
  }
  return "?";
}

namespace {

constexpr int kFormatVersion = 1;
// The format nests 5 levels (snapshot, segments, segment, blocks, block); deeper input is not a
// snapshot, and refusing it early keeps memory and error messages bounded.
constexpr int kMaxDepth = 16;

std::uint64_t stream_value(Stream s) { return static_cast<std::uint64_t>(s); }

json stat_arrays(const AllocatorStats& s) { return json::parse(to_json(s)); }

// "a number", "an array", ...: what a value is, for "expected ..., found ..." messages.
std::string a_kind_of(const json& v) {
  const std::string_view name = v.type_name();  // "number", "array", "boolean", "null", ...
  if (v.is_null()) return std::string(name);
  return fmt::format("{} {}", name.front() == 'a' || name.front() == 'o' ? "an" : "a", name);
}

// A field reader that reports "where: expected what". The path ("snapshot.segments[3].blocks[0]")
// is put together only for an error: building it for every entry dominated reading large traces.
struct Reader {
  static constexpr std::size_t kNoIndex = static_cast<std::size_t>(-1);
  const json& j;
  const char* name;
  std::size_t index = kNoIndex;
  const Reader* parent = nullptr;

  std::string where() const {
    std::string w = parent != nullptr ? parent->where() + "." + name : std::string(name);
    if (index != kNoIndex) w += fmt::format("[{}]", index);
    return w;
  }

  const json& field(const char* key) const {
    if (!j.is_object()) {
      // The top level is the snapshot itself: "snapshot: " already says so.
      const std::string at = parent == nullptr && index == kNoIndex ? "" : where() + ": ";
      throw ParseError(fmt::format("snapshot: {}expected an object, found {}", at, a_kind_of(j)));
    }
    auto it = j.find(key);
    if (it == j.end()) throw ParseError(fmt::format("snapshot: {}.{}: missing", where(), key));
    return *it;
  }
  std::uint64_t u64(const char* key) const {
    const json& v = field(key);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0)) {
      throw ParseError(fmt::format("snapshot: {}.{}: expected an unsigned integer", where(), key));
    }
    return v.get<std::uint64_t>();
  }
  std::int64_t i64(const char* key) const {
    const json& v = field(key);
    if (!v.is_number_integer()) throw ParseError(fmt::format("snapshot: {}.{}: expected an integer", where(), key));
    // is_number_integer() also holds for unsigned values, which may not fit
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t{INT64_MAX}) {
      throw ParseError(fmt::format("snapshot: {}.{}: {} is out of range (at most {})", where(), key,
                                   v.get<std::uint64_t>(), INT64_MAX));
    }
    return v.get<std::int64_t>();
  }
  int i32(const char* key) const {
    const std::int64_t v = i64(key);
    if (v < INT_MIN || v > INT_MAX) {
      throw ParseError(fmt::format("snapshot: {}.{}: {} is out of range for an int", where(), key, v));
    }
    return static_cast<int>(v);
  }
  std::string str(const char* key) const {
    const json& v = field(key);
    if (!v.is_string()) throw ParseError(fmt::format("snapshot: {}.{}: expected a string", where(), key));
    return v.get<std::string>();
  }
  bool boolean(const char* key) const {
    const json& v = field(key);
    if (!v.is_boolean()) throw ParseError(fmt::format("snapshot: {}.{}: expected true or false", where(), key));
    return v.get<bool>();
  }
  const json& array(const char* key) const {
    const json& v = field(key);
    if (!v.is_array()) throw ParseError(fmt::format("snapshot: {}.{}: expected an array", where(), key));
    return v;
  }
  template <typename E, std::size_t N>
  E named(const char* key, const E (&values)[N]) const {
    const std::string s = str(key);
    for (E e : values) {
      if (s == to_string(e)) return e;
    }
    throw ParseError(fmt::format("snapshot: {}.{}: unknown value \"{}\"", where(), key, s));
  }
};

void read_stats(const Reader& r, AllocatorStats& s) {
  auto arr = [&](const char* name, StatArray& a) {
    for (auto [pool, stat] :
         {std::pair<const char*, Stat*>{"all", &a.all}, {"small_pool", &a.small_pool}, {"large_pool", &a.large_pool}}) {
      const std::string prefix = std::string(name) + "." + pool + ".";
      stat->current = r.i64((prefix + "current").c_str());
      stat->peak = r.i64((prefix + "peak").c_str());
      stat->allocated = r.i64((prefix + "allocated").c_str());
      stat->freed = r.i64((prefix + "freed").c_str());
    }
  };
  arr("allocated_bytes", s.allocated_bytes);
  arr("reserved_bytes", s.reserved_bytes);
  arr("active_bytes", s.active_bytes);
  arr("inactive_split_bytes", s.inactive_split_bytes);
  arr("requested_bytes", s.requested_bytes);
  arr("allocation", s.allocation);
  arr("segment", s.segment);
  s.num_alloc_retries = r.i64("num_alloc_retries");
  s.num_ooms = r.i64("num_ooms");
  s.num_device_alloc = r.i64("num_device_alloc");
  s.num_device_free = r.i64("num_device_free");
  s.num_stream_waits = r.i64("num_stream_waits");
  s.num_sync_all_streams = r.i64("num_sync_all_streams");
}

const char* pool_name(Pool p) { return p == Pool::small ? "small" : "large"; }

}  // namespace

std::string to_json(const Snapshot& snap) {
  json j;
  j["version"] = kFormatVersion;
  j["device"] = snap.device;
  j["device_name"] = snap.device_name;
  j["capacity"] = snap.capacity;
  j["stats"] = stat_arrays(snap.stats);
  json segs = json::array();
  for (const SegmentInfo& s : snap.segments) {
    json js{{"address", s.address},         {"total_size", s.total_size}, {"allocated_size", s.allocated_size},
            {"active_size", s.active_size}, {"pool", pool_name(s.pool)},  {"stream", stream_value(s.stream)},
            {"expandable", s.expandable}};
    json blocks = json::array();
    for (const BlockInfo& b : s.blocks) {
      blocks.push_back({{"address", b.address},
                        {"size", b.size},
                        {"requested_size", b.requested_size},
                        {"state", to_string(b.state)},
                        {"stream", stream_value(b.stream)},
                        {"tag", b.tag}});
    }
    js["blocks"] = std::move(blocks);
    segs.push_back(std::move(js));
  }
  j["segments"] = std::move(segs);
  json trace = json::array();
  for (const TraceEntry& t : snap.trace) {
    trace.push_back({{"action", to_string(t.action)},
                     {"address", t.address},
                     {"size", t.size},
                     {"stream", stream_value(t.stream)},
                     {"time_ns", t.time_ns},
                     {"tag", t.tag}});
  }
  j["trace"] = std::move(trace);
  // Tags are the caller's bytes: one cut mid-character must not make every snapshot fail, so
  // bytes that are not UTF-8 are written as U+FFFD.
  return j.dump(1, ' ', false, json::error_handler_t::replace);
}

namespace {

Snapshot read_snapshot(const json& j) {
  const Reader top{j, "snapshot"};
  if (top.i64("version") != kFormatVersion) {
    throw ParseError(fmt::format("snapshot: snapshot.version: expected {}", kFormatVersion));
  }
  Snapshot snap;
  snap.device = top.i32("device");
  snap.device_name = top.str("device_name");
  snap.capacity = top.u64("capacity");
  read_stats(Reader{top.field("stats"), "stats", Reader::kNoIndex, &top}, snap.stats);
  const json& segs = top.array("segments");
  for (std::size_t i = 0; i < segs.size(); ++i) {
    const Reader r{segs[i], "segments", i, &top};
    SegmentInfo s;
    s.address = r.u64("address");
    s.total_size = r.u64("total_size");
    s.allocated_size = r.u64("allocated_size");
    s.active_size = r.u64("active_size");
    const std::string pool = r.str("pool");
    if (pool != "small" && pool != "large") {
      throw ParseError(fmt::format("snapshot: {}.pool: expected \"small\" or \"large\"", r.where()));
    }
    s.pool = pool == "small" ? Pool::small : Pool::large;
    s.stream = Stream{r.u64("stream")};
    s.expandable = r.boolean("expandable");
    const json& blocks = r.array("blocks");
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      const Reader b{blocks[k], "blocks", k, &r};
      BlockInfo bi;
      bi.address = b.u64("address");
      bi.size = b.u64("size");
      bi.requested_size = b.u64("requested_size");
      bi.state =
          b.named("state", {BlockState::active_allocated, BlockState::active_pending_free, BlockState::inactive});
      bi.stream = Stream{b.u64("stream")};
      bi.tag = b.str("tag");
      s.blocks.push_back(std::move(bi));
    }
    snap.segments.push_back(std::move(s));
  }
  const json& trace = top.array("trace");
  for (std::size_t i = 0; i < trace.size(); ++i) {
    const Reader r{trace[i], "trace", i, &top};
    TraceEntry t;
    t.action = r.named("action", {TraceAction::alloc, TraceAction::free_requested, TraceAction::free_completed,
                                  TraceAction::segment_map, TraceAction::segment_unmap, TraceAction::oom});
    t.address = r.u64("address");
    t.size = r.u64("size");
    t.stream = Stream{r.u64("stream")};
    t.time_ns = r.i64("time_ns");
    t.tag = r.str("tag");
    snap.trace.push_back(std::move(t));
  }
  return snap;
}

}  // namespace

Snapshot snapshot_from_json(const std::string& text) {
  if (text.size() > kMaxSnapshotJsonBytes) {
    throw ParseError(fmt::format("snapshot: {} bytes, more than the limit of {}", text.size(), kMaxSnapshotJsonBytes));
  }
  if (const auto at = detail::json_too_deep_at(text, kMaxDepth))
    throw ParseError(fmt::format("snapshot: nested deeper than {} levels at byte {}", kMaxDepth, *at));
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw ParseError(fmt::format("snapshot: not JSON (malformed at byte {}): {}", e.byte, e.what()));
  } catch (const json::exception& e) {  // e.g. a number beyond double's range (out_of_range 406)
    throw ParseError(fmt::format("snapshot: unreadable JSON: {}", e.what()));
  }
  try {
    return read_snapshot(j);
  } catch (const json::exception& e) {  // a check above missed a case: still the caller's bad input
    throw ParseError(fmt::format("snapshot: malformed: {}", e.what()));
  }
}

}  // namespace stowage
