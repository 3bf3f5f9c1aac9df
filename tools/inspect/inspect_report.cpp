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

// Keeps charts and JSON small: at most about `limit` points. The points are cut into limit / 2
// runs; each run keeps its lowest and highest point by `value` (in their order), so a spike
// stays visible however short (a 64 MiB block among thousands of 4 KiB ones), and the first
// and last points stay.
template <typename T, typename Value>
std::vector<T> thin(const std::vector<T>& v, std::size_t limit, Value value) {
  if (v.size() <= limit || limit < 4) return v;
  std::vector<T> out;
  out.reserve(limit + 2);
  out.push_back(v.front());
  const std::size_t runs = limit / 2, n = v.size() - 2;  // the first and last are kept anyway
  for (std::size_t r = 0; r < runs; ++r) {
    const std::size_t begin = 1 + n * r / runs, end = 1 + n * (r + 1) / runs;
    if (begin >= end) continue;
    std::size_t lo = begin, hi = begin;
    for (std::size_t i = begin; i < end; ++i) {
      if (value(v[i]) < value(v[lo])) lo = i;
      if (value(v[i]) > value(v[hi])) hi = i;
    }
    out.push_back(v[std::min(lo, hi)]);
    if (lo != hi) out.push_back(v[std::max(lo, hi)]);
  }
  out.push_back(v.back());
  return out;
}

struct Series {
  const char* name;
  const char* color;
  std::vector<std::pair<double, double>> points;  // (x, bytes)
};

// Where x falls between lo and hi, in [0, 1], for any finite inputs: ranges wider than a double
// holds (1e308 − -1e308) are scaled down first, so a coordinate is never inf or nan.
double fraction(double x, double lo, double hi) {
  double f = (x - lo) / (hi - lo);
  if (!std::isfinite(f)) f = (x / 4 - lo / 4) / (hi / 4 - lo / 4);
  if (!std::isfinite(f)) return 0.0;
  return std::clamp(f, 0.0, 1.0);
}

std::string byte_label(double b) {
  return b >= 0x1p64 ? fmt::format("{:.3g} B", b) : format_bytes(static_cast<std::uint64_t>(std::max(0.0, b)));
}

// An x value as an axis label: short, whatever its magnitude.
std::string x_label_text(double x) {
  const double a = std::fabs(x);
  return a != 0 && (a >= 1e6 || a < 1e-3) ? fmt::format("{:.3g}", x) : fmt::format("{:.4g}", x);
}

// A vertical mark on the x axis (a training step's start) and its label.
struct Mark {
  double x;
  std::string label;
};

// Step marks' colour; also how tests find them in the SVG.
constexpr const char* kMarkColor = "#b07aa1";

std::string chart(const std::string& title, const std::string& x_label, const std::vector<Series>& series,
                  const std::vector<Mark>& marks = {}) {
  const double left = 90, top = 50, w = 640, h = 300;
  tools::SvgWriter svg(left + w + 160, top + h + 60);
  svg.text(left, 25, title, 15);
  double x_min = 0, x_max = 1, y_max = 1;
  bool first = true;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      if (first) x_min = x_max = x, first = false;
      x_min = std::min(x_min, x);
      x_max = std::max(x_max, x);
      y_max = std::max(y_max, y);
    }
  if (!(x_max > x_min)) x_max = x_min + 1;
  if (x_max == x_min) x_min = x_max - 1;  // + 1 is lost at magnitudes beyond 2^53
  // Axis ticks: five on each axis, with their values.
  for (int i = 0; i <= 4; ++i) {
    const double y = top + h - h * i / 4.0;
    svg.line(left, y, left + w, y, "#dddddd");
    svg.text(left - 6, y + 4, byte_label(y_max * i / 4.0), 10, "end");
    const double x = left + w * i / 4.0;
    svg.line(x, top + h, x, top + h + 5, "#888888");
    svg.text(x, top + h + 18, x_label_text(x_min / 4 * (4 - i) + x_max / 4 * i), 10, "middle");
  }
  svg.text(left + w / 2, top + h + 35, x_label, 11, "middle");
  // Marks under the curves: a line each while they are at least a pixel apart (so at most one per
  // pixel column however many steps), a label while labels are 40 px apart.
  double last_line = -1e9, last_label = -1e9;
  for (const auto& m : marks) {
    if (!std::isfinite(m.x)) continue;
    const double x = left + fraction(m.x, x_min, x_max) * w;
    if (x - last_line < 1.0) continue;
    svg.line(x, top, x, top + h, kMarkColor);
    last_line = x;
    if (x - last_label >= 40.0) {
      svg.text(x, top - 4, m.label, 9, "middle");
      last_label = x;
    }
  }
  std::size_t row = 0;
  for (const auto& s : series) {
    std::string pts;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      pts += fmt::format("{:.1f},{:.1f} ", left + fraction(x, x_min, x_max) * w, top + h - fraction(y, 0.0, y_max) * h);
    }
    if (!pts.empty()) svg.polyline(pts, s.color);
    svg.rect(left + w + 20, top + 20.0 * double(row), 12, 12, s.color);
    svg.text(left + w + 38, top + 20.0 * double(row) + 10, s.name, 11);
    ++row;
  }
  return svg.finish();
}

}  // namespace

std::string device_list(const std::vector<int>& devices) {
  std::string out;
  for (int d : devices) out += fmt::format("{}cuda:{}", out.empty() ? "" : ", ", d);
  return out;
}

std::string skipped_note(const std::vector<int>& skipped) {
  return fmt::format(
      "{} skipped: no segments, and no trace entry that changes memory (PyTorch marks each snapshot in every "
      "device's trace)",
      device_list(skipped));
}

nlohmann::json to_json(const SnapshotAnalysis& a) {
  nlohmann::json blocks = nlohmann::json::array();
  for (const auto& b : a.largest_blocks)
    blocks.push_back({{"address", b.address},
                      {"size", b.size},
                      {"requested_size", b.requested},
                      {"state", b.state},
                      {"tag", b.tag}});
  nlohmann::json timeline = nlohmann::json::array();
  for (const auto& p : thin(a.timeline, 2000, [](const TimelinePoint& q) { return q.allocated; }))
    timeline.push_back({{"time_ns", p.time_ns},
                        {"events", p.events},
                        {"allocated", p.allocated},
                        {"reserved", p.reserved},
                        {"fragmentation", p.fragmentation()}});
  nlohmann::json ooms = nlohmann::json::array();
  for (const auto& o : a.ooms)
    ooms.push_back({{"time_ns", o.time_ns},
                    {"events", o.events},
                    {"requested", o.requested},
                    {"device_free", o.device_free},
                    {"tag", o.tag}});
  // Step marks, at most about 2000 (evenly chosen when a trace has more).
  nlohmann::json steps = nlohmann::json::array();
  const std::size_t stride = a.steps.size() / 2000 + 1;
  for (std::size_t i = 0; i < a.steps.size(); i += stride)
    steps.push_back({{"step", a.steps[i].step}, {"time_ns", a.steps[i].time_ns}, {"events", a.steps[i].events}});
  return {{"schema", "stowage.inspect/1"},
          {"kind", "snapshot"},
          {"device_name", a.device_name},
          {"devices", a.devices},
          {"skipped_devices", a.skipped_devices},
          {"capacity", a.capacity > 0 ? nlohmann::json(a.capacity) : nlohmann::json()},  // null: unknown
          {"allocated", a.allocated},
          {"reserved", a.reserved},
          {"peak_allocated", a.peak_allocated},
          {"peak_reserved", a.peak_reserved},
          {"fragmentation", a.fragmentation},
          {"largest_free_block", a.largest_free},
          {"segments", a.segments},
          {"num_ooms", a.num_ooms},
          {"ooms", ooms},
          {"largest_blocks", blocks},
          {"tags_now", tags_json(a.tags_now)},
          {"tags_at_peak", tags_json(a.tags_at_peak)},
          {"trace_events", a.trace_events},
          {"trace_timed", a.trace_timed},
          {"trace_peak_allocated", a.trace_peak_allocated},
          {"fragmentation_at_peak", a.fragmentation_at_peak},
          {"largest_gap", a.largest_gap},
          {"steps", steps},
          {"timeline", timeline}};
}

std::string to_table(const SnapshotAnalysis& a) {
  std::string out = fmt::format("device {} (capacity {})\n", a.device_name,
                                a.capacity > 0 ? format_bytes(a.capacity) : std::string("unknown"));
  if (a.devices.size() > 1) {
    std::vector<int> others;
    for (int d : a.devices)
      if (d != a.device) others.push_back(d);
    out += fmt::format("  note: the file also holds {} (select one with --device N)\n", device_list(others));
  }
  if (!a.skipped_devices.empty()) out += fmt::format("  note: {}\n", skipped_note(a.skipped_devices));
  out += fmt::format("  allocated {:>14}   peak {:>14}\n", format_bytes(a.allocated), format_bytes(a.peak_allocated));
  out += fmt::format("  reserved  {:>14}   peak {:>14}\n", format_bytes(a.reserved), format_bytes(a.peak_reserved));
  out += fmt::format("  fragmentation {:.1f}% (reserved but free), largest free block {}, {} segments, {} OOMs\n",
                     100.0 * a.fragmentation, format_bytes(a.largest_free), a.segments, a.num_ooms);
  for (const auto& o : a.ooms)
    out += fmt::format("  OOM: asked for {}{}{}\n", format_bytes(o.requested),
                       o.device_free > 0 ? fmt::format(" ({} free on the device)", format_bytes(o.device_free)) : "",
                       o.tag.empty() ? "" : ": " + o.tag);
  if (!a.timeline.empty()) {
    out += fmt::format(
        "  trace: {} events, allocated peak {} with {:.1f}% of reserved free; largest reserved-but-free gap {}\n",
        a.trace_events, format_bytes(a.trace_peak_allocated), 100.0 * a.fragmentation_at_peak,
        format_bytes(a.largest_gap));
    if (!a.steps.empty())
      out += fmt::format("  steps: {} marked, step {} to step {}\n", a.steps.size(), a.steps.front().step,
                         a.steps.back().step);
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
    largest.push_back(
        {{"time", r.time}, {"pointer", r.pointer}, {"size", r.size}, {"thread", r.thread}, {"stream", r.stream}});
  nlohmann::json timeline = nlohmann::json::array();
  for (const auto& [t, b] : thin(a.timeline, 2000, [](const auto& q) { return q.second; }))
    timeline.push_back({{"time", t}, {"live", b}});
  return {{"schema", "stowage.inspect/1"},
          {"kind", "event_log"},
          {"events", a.events},
          {"allocations", a.allocations},
          {"frees", a.frees},
          {"unmatched_frees", a.unmatched_frees},
          {"peak_live", a.peak_live},
          {"peak_time", a.peak_time},
          {"live_at_end", a.live_at_end},
          {"live_blocks_at_end", a.live_blocks_at_end},
          {"largest_allocations", largest},
          {"timeline", timeline}};
}

std::string to_table(const EventLogAnalysis& a) {
  std::string out = fmt::format("{} events ({} allocations, {} frees, {} frees of unknown pointers)\n", a.events,
                                a.allocations, a.frees, a.unmatched_frees);
  out += fmt::format("  peak live {} at {:.6f} s; live at end {} in {} blocks\n", format_bytes(a.peak_live),
                     a.peak_time, format_bytes(a.live_at_end), a.live_blocks_at_end);
  out += "largest allocations:\n";
  for (const auto& r : a.largest)
    out += fmt::format("  {:>14}  {:#x}  at {:.6f} s, stream {}\n", format_bytes(r.size), r.pointer, r.time, r.stream);
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
  for (const auto& [tag, v] : rows)
    tag_rows.push_back({{"tag", tag}, {"a", v.first}, {"b", v.second}, {"change", v.second - v.first}});
  return {{"schema", "stowage.inspect.compare/1"},
          {"peak_allocated", stat(a.peak_allocated, b.peak_allocated)},
          {"peak_reserved", stat(a.peak_reserved, b.peak_reserved)},
          {"allocated", stat(a.allocated, b.allocated)},
          {"reserved", stat(a.reserved, b.reserved)},
          {"segments", stat(a.segments, b.segments)},
          {"fragmentation",
           {{"a", a.fragmentation}, {"b", b.fragmentation}, {"change", b.fragmentation - a.fragmentation}}},
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
  // x: milliseconds since the first traced event, or the event's index when the trace has no
  // times (PyTorch's before about 2.1).
  const double t0 = a.timeline.empty() ? 0.0 : double(a.timeline.front().time_ns);
  auto x = [&](std::int64_t time_ns, std::int64_t events) {
    return a.trace_timed ? (double(time_ns) - t0) / 1e6 : double(events);
  };
  for (const auto& p : thin(a.timeline, 4000, [](const TimelinePoint& q) { return q.allocated; }))
    alloc.points.emplace_back(x(p.time_ns, p.events), double(p.allocated));
  for (const auto& p : thin(a.timeline, 4000, [](const TimelinePoint& q) { return q.reserved; }))
    res.points.emplace_back(x(p.time_ns, p.events), double(p.reserved));
  if (a.timeline.empty()) {
    alloc.points = {{0, double(a.allocated)}, {1, double(a.allocated)}};
    res.points = {{0, double(a.reserved)}, {1, double(a.reserved)}};
  }
  std::vector<Mark> marks;
  marks.reserve(a.steps.size());
  for (const auto& m : a.steps) marks.push_back({x(m.time_ns, m.events), fmt::format("step {}", m.step)});
  return chart(title,
               a.trace_timed || a.timeline.empty() ? "time since the first traced event (ms)"
                                                   : "trace event (the snapshot records no times)",
               {alloc, res}, marks);
}

std::string timeline_svg(const EventLogAnalysis& a, const std::string& title) {
  Series live{"live (requested)", "#4e79a7", {}};
  for (const auto& [t, b] : thin(a.timeline, 4000, [](const auto& q) { return q.second; }))
    live.points.emplace_back(t, double(b));
  return chart(title, "time (s)", {live});
}

}  // namespace stowage::inspect
