#include "tools/inspect/inspect_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "stowage/byte_size.hpp"
#include "tools/common/svg.hpp"

namespace stowage::inspect {


namespace {

nlohmann::json tags_json(const std::vector<TagBytes>& tags) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& t : tags) out.push_back({{"tag", t.tag}, {"bytes", t.bytes}});
  return out;
}

// Keeps charts small: at most `limit` points, every k-th kept plus the last.
template <typename T>
std::vector<T> thin(const std::vector<T>& v, std::size_t limit) {
  if (v.size() <= limit) return v;
  std::vector<T> out;
  const std::size_t k = (v.size() + limit - 1) / limit;
  for (std::size_t i = 0; i < v.size(); i += k) out.push_back(v[i]);
  out.push_back(v.back());
  return out;
}

struct Series {
  const char* name;
  const char* color;
  std::vector<std::pair<double, double>> points;  // (x, bytes)
};

std::string chart(const std::string& title, const std::string& x_label, const std::vector<Series>& series) {
  const double left = 90, top = 50, w = 640, h = 300;
  tools::SvgWriter svg(left + w + 160, top + h + 60);
  svg.text(left, 25, title, 15);
  double x_min = 0, x_max = 1, y_max = 1;
  bool first = true;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      if (first) x_min = x_max = x, first = false;
      x_min = std::min(x_min, x);
      x_max = std::max(x_max, x);
      y_max = std::max(y_max, y);
    }
  if (x_max <= x_min) x_max = x_min + 1;
  for (int i = 0; i <= 4; ++i) {
    const double y = top + h - h * i / 4.0;
    svg.line(left, y, left + w, y, "#dddddd");
    svg.text(left - 6, y + 4, format_bytes(std::llround(y_max * i / 4.0)), 10, "end");
  }
  svg.text(left + w / 2, top + h + 35, x_label, 11, "middle");
  std::size_t row = 0;
  for (const auto& s : series) {
    std::string pts;
    for (const auto& [x, y] : s.points)
      pts += fmt::format("{:.1f},{:.1f} ", left + (x - x_min) / (x_max - x_min) * w, top + h - y / y_max * h);
    if (!pts.empty()) svg.polyline(pts, s.color);
    svg.rect(left + w + 20, top + 20.0 * double(row), 12, 12, s.color);
    svg.text(left + w + 38, top + 20.0 * double(row) + 10, s.name, 11);
    ++row;
  }
  return svg.finish();
}

}  // namespace

nlohmann::json to_json(const SnapshotAnalysis& a) {
  nlohmann::json blocks = nlohmann::json::array();
  for (const auto& b : a.largest_blocks)
    blocks.push_back({{"address", b.address}, {"size", b.size}, {"requested_size", b.requested}, {"state", b.state}, {"tag", b.tag}});
  nlohmann::json timeline = nlohmann::json::array();
  for (const auto& p : thin(a.timeline, 2000))
    timeline.push_back({{"time_ns", p.time_ns}, {"allocated", p.allocated}, {"reserved", p.reserved},
                        {"fragmentation", p.fragmentation()}});
  return {{"schema", "stowage.inspect/1"},
          {"kind", "snapshot"},
          {"device_name", a.device_name},
          {"capacity", a.capacity},
          {"allocated", a.allocated},
          {"reserved", a.reserved},
          {"peak_allocated", a.peak_allocated},
          {"peak_reserved", a.peak_reserved},
          {"fragmentation", a.fragmentation},
          {"largest_free_block", a.largest_free},
          {"segments", a.segments},
          {"num_ooms", a.num_ooms},
          {"largest_blocks", blocks},
          {"tags_now", tags_json(a.tags_now)},
          {"tags_at_peak", tags_json(a.tags_at_peak)},
          {"trace_peak_allocated", a.trace_peak_allocated},
          {"fragmentation_at_peak", a.fragmentation_at_peak},
          {"largest_gap", a.largest_gap},
          {"timeline", timeline}};
}

std::string to_table(const SnapshotAnalysis& a) {
  std::string out = fmt::format("device {} (capacity {})\n", a.device_name, format_bytes(a.capacity));
  out += fmt::format("  allocated {:>14}   peak {:>14}\n", format_bytes(a.allocated), format_bytes(a.peak_allocated));
  out += fmt::format("  reserved  {:>14}   peak {:>14}\n", format_bytes(a.reserved), format_bytes(a.peak_reserved));
  out += fmt::format("  fragmentation {:.1f}% (reserved but free), largest free block {}, {} segments, {} OOMs\n",
                     100.0 * a.fragmentation, format_bytes(a.largest_free), a.segments, a.num_ooms);
  if (!a.timeline.empty()) {
    out += fmt::format("  trace: {} events, allocated peak {} with {:.1f}% of reserved free; largest reserved-but-free gap {}\n",
                       a.timeline.size(), format_bytes(a.trace_peak_allocated), 100.0 * a.fragmentation_at_peak,
                       format_bytes(a.largest_gap));
  }
  out += "largest blocks:\n";
  for (const auto& b : a.largest_blocks)
    out += fmt::format("  {:>14}  {:#x}  {:<20} {}\n", format_bytes(b.size), b.address, b.state, b.tag);
  out += "tags at the traced peak:\n";
  for (const auto& t : a.tags_at_peak) out += fmt::format("  {:>14}  {}\n", format_bytes(t.bytes), t.tag);
  out += "tags now:\n";
  for (const auto& t : a.tags_now) out += fmt::format("  {:>14}  {}\n", format_bytes(t.bytes), t.tag);
  return out;
}

nlohmann::json to_json(const EventLogAnalysis& a) {
  nlohmann::json largest = nlohmann::json::array();
  for (const auto& r : a.largest)
    largest.push_back({{"time", r.time}, {"pointer", r.pointer}, {"size", r.size}, {"thread", r.thread}, {"stream", r.stream}});
  nlohmann::json timeline = nlohmann::json::array();
  for (const auto& [t, b] : thin(a.timeline, 2000)) timeline.push_back({{"time", t}, {"live", b}});
  return {{"schema", "stowage.inspect/1"}, {"kind", "event_log"},       {"events", a.events},
          {"allocations", a.allocations},  {"frees", a.frees},          {"unmatched_frees", a.unmatched_frees},
          {"peak_live", a.peak_live},      {"peak_time", a.peak_time},  {"live_at_end", a.live_at_end},
          {"live_blocks_at_end", a.live_blocks_at_end}, {"largest_allocations", largest}, {"timeline", timeline}};
}

std::string to_table(const EventLogAnalysis& a) {
  std::string out = fmt::format("{} events ({} allocations, {} frees, {} frees of unknown pointers)\n", a.events,
                                a.allocations, a.frees, a.unmatched_frees);
  out += fmt::format("  peak live {} at {:.6f} s; live at end {} in {} blocks\n", format_bytes(a.peak_live), a.peak_time,
                     format_bytes(a.live_at_end), a.live_blocks_at_end);
  out += "largest allocations:\n";
  for (const auto& r : a.largest)
    out += fmt::format("  {:>14}  {:#x}  at {:.6f} s, stream {}\n", format_bytes(static_cast<std::int64_t>(r.size)),
                       r.pointer, r.time, r.stream);
  return out;
}

nlohmann::json compare_json(const SnapshotAnalysis& a, const SnapshotAnalysis& b) {
  auto stat = [](std::int64_t x, std::int64_t y) { return nlohmann::json{{"a", x}, {"b", y}, {"change", y - x}}; };
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> tags;
  for (const auto& t : a.tags_now) tags[t.tag].first = t.bytes;
  for (const auto& t : b.tags_now) tags[t.tag].second = t.bytes;
  std::vector<std::pair<std::string, std::pair<std::int64_t, std::int64_t>>> rows(tags.begin(), tags.end());
  std::stable_sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) {
    return std::llabs(x.second.second - x.second.first) > std::llabs(y.second.second - y.second.first);
  });
  nlohmann::json tag_rows = nlohmann::json::array();
  for (const auto& [tag, v] : rows) tag_rows.push_back({{"tag", tag}, {"a", v.first}, {"b", v.second}, {"change", v.second - v.first}});
  return {{"schema", "stowage.inspect.compare/1"},
          {"peak_allocated", stat(a.peak_allocated, b.peak_allocated)},
          {"peak_reserved", stat(a.peak_reserved, b.peak_reserved)},
          {"allocated", stat(a.allocated, b.allocated)},
          {"reserved", stat(a.reserved, b.reserved)},
          {"segments", stat(a.segments, b.segments)},
          {"fragmentation", {{"a", a.fragmentation}, {"b", b.fragmentation}, {"change", b.fragmentation - a.fragmentation}}},
          {"tags", tag_rows}};
}

std::string compare_table(const SnapshotAnalysis& a, const SnapshotAnalysis& b) {
  std::string out = fmt::format("  {:<18}{:>14}{:>14}{:>15}\n", "", "A", "B", "B − A");
  auto row = [&](const char* name, std::int64_t x, std::int64_t y) {
    out += fmt::format("  {:<18}{:>14}{:>14}{:>15}\n", name, format_bytes(x), format_bytes(y), format_bytes(y - x));
  };
  row("peak allocated", a.peak_allocated, b.peak_allocated);
  row("peak reserved", a.peak_reserved, b.peak_reserved);
  row("allocated", a.allocated, b.allocated);
  row("reserved", a.reserved, b.reserved);
  out += fmt::format("  {:<18}{:>13.1f}%{:>13.1f}%\n", "fragmentation", 100 * a.fragmentation, 100 * b.fragmentation);
  out += "bytes per tag (largest change first):\n";
  const nlohmann::json diff = compare_json(a, b);
  for (const auto& t : diff["tags"])
    row(t["tag"].get<std::string>().c_str(), t["a"].get<std::int64_t>(), t["b"].get<std::int64_t>());
  return out;
}

std::string timeline_svg(const SnapshotAnalysis& a, const std::string& title) {
  Series alloc{"allocated", "#4e79a7", {}}, res{"reserved", "#e15759", {}};
  const auto pts = thin(a.timeline, 4000);
  const double t0 = pts.empty() ? 0.0 : double(pts.front().time_ns);
  for (const auto& p : pts) {
    alloc.points.emplace_back((double(p.time_ns) - t0) / 1e6, double(p.allocated));
    res.points.emplace_back((double(p.time_ns) - t0) / 1e6, double(p.reserved));
  }
  if (pts.empty()) {
    alloc.points = {{0, double(a.allocated)}, {1, double(a.allocated)}};
    res.points = {{0, double(a.reserved)}, {1, double(a.reserved)}};
  }
  return chart(title, "time since the first traced event (ms)", {alloc, res});
}

std::string timeline_svg(const EventLogAnalysis& a, const std::string& title) {
  Series live{"live (requested)", "#4e79a7", {}};
  for (const auto& [t, b] : thin(a.timeline, 4000)) live.points.emplace_back(t, double(b));
  return chart(title, "time (s)", {live});
}

}  // namespace stowage::inspect
