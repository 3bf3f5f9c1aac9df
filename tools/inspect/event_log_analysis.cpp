#include "tools/inspect/event_log_analysis.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "stowage/error.hpp"
#include "tools/common/json_input.hpp"

namespace stowage::inspect {

namespace {
// Live bytes saturate instead of wrapping: a log of absurd sizes still gives a readable peak.
std::int64_t add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? (b > 0 ? INT64_MAX : INT64_MIN) : r;
}
}  // namespace

EventLogAnalysis analyze(const std::vector<EventRecord>& records, std::size_t top) {
  EventLogAnalysis a;
  std::unordered_map<std::uintptr_t, std::int64_t> live;
  std::int64_t bytes = 0;
  for (const auto& r : records) {
    ++a.events;
    const auto size = static_cast<std::int64_t>(std::min<std::uint64_t>(r.size, INT64_MAX));
    if (r.action == EventAction::allocate) {
      ++a.allocations;
      if (auto it = live.find(r.pointer); it != live.end()) bytes = add(bytes, -it->second);  // reused, no free logged
      live[r.pointer] = size;
      bytes = add(bytes, size);
      a.largest.push_back(r);
    } else {
      ++a.frees;
      if (auto it = live.find(r.pointer); it != live.end()) {
        bytes = add(bytes, -it->second);
        live.erase(it);
      } else {
        ++a.unmatched_frees;
      }
    }
    a.timeline.emplace_back(r.time, bytes);
    if (bytes > a.peak_live) {
      a.peak_live = bytes;
      a.peak_time = r.time;
    }
  }
  a.live_at_end = bytes;
  a.live_blocks_at_end = static_cast<std::int64_t>(live.size());
  std::stable_sort(a.largest.begin(), a.largest.end(), [](const auto& x, const auto& y) { return x.size > y.size; });
  if (a.largest.size() > top) a.largest.resize(top);
  return a;
}

std::vector<EventRecord> load_event_log(const std::string& path) {
  std::istringstream in(tools::read_file(path));
  return parse_event_log(in, path);
}

bool looks_like_event_log(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ParseError(fmt::format("cannot open '{}'", path));
  std::string head(std::string_view(kEventLogHeader).size(), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(in.gcount()));
  return head == kEventLogHeader;
}

}  // namespace stowage::inspect
