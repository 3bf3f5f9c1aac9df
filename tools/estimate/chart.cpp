#include "tools/estimate/chart.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "stowage/byte_size.hpp"
#include "tools/common/svg.hpp"

namespace stowage::estimate {

namespace {
struct Segment {
  const char* name;
  const char* color;
  std::int64_t (*bytes)(const StageMemory&);
};
constexpr Segment kSegments[] = {
    {"weights", "#4e79a7", [](const StageMemory& m) { return m.weights; }},
    {"gradients", "#f28e2b", [](const StageMemory& m) { return m.gradients; }},
    {"optimizer states", "#e15759", [](const StageMemory& m) { return m.optimizer_states; }},
    {"activations", "#76b7b2", [](const StageMemory& m) { return m.activation_total(); }},
    {"communication", "#59a14f", [](const StageMemory& m) { return m.communication; }},
    {"framework workspaces", "#edc948", [](const StageMemory& m) { return m.framework; }},
    {"allocator overhead", "#bab0ac", [](const StageMemory& m) { return m.allocator_overhead; }},
};
}  // namespace

std::string to_svg(const EstimateResult& r) {
  std::vector<std::pair<std::string, const StageMemory*>> bars{{"no stowage", &r.baseline}};
  for (const auto& v : r.alone) bars.emplace_back(v.name, &v.memory);
  bars.emplace_back("all together", &r.all.memory);
  bars.emplace_back("configured", &r.configured);
  std::int64_t top = 1;
  for (const auto& [name, m] : bars) top = std::max(top, m->peak_reserved);

  const double left = 80, plot_h = 320, plot_top = 50, bar_w = 70, gap = 30;
  const double width = left + double(bars.size()) * (bar_w + gap) + 190, height = plot_top + plot_h + 70;
  tools::SvgWriter svg(width, height);
  svg.text(left, 25, fmt::format("{}: peak reserved per device (stage {})", r.config.model.name, r.configured.stage),
           15);
  const double scale = plot_h / double(top);
  for (int i = 0; i <= 4; ++i) {
    const double y = plot_top + plot_h - plot_h * i / 4.0;
    svg.line(left - 5, y, left + double(bars.size()) * (bar_w + gap), y, "#dddddd");
    svg.text(left - 8, y + 4, format_bytes(top * i / 4), 10, "end");
  }
  for (std::size_t b = 0; b < bars.size(); ++b) {
    const double x = left + gap / 2 + double(b) * (bar_w + gap);
    double y = plot_top + plot_h;
    for (const auto& s : kSegments) {
      const double h = double(s.bytes(*bars[b].second)) * scale;
      if (h <= 0) continue;
      y -= h;
      svg.rect(x, y, bar_w, h, s.color, fmt::format("{}: {}", s.name, format_bytes(s.bytes(*bars[b].second))));
    }
    svg.text(x + bar_w / 2, y - 5, format_bytes(bars[b].second->peak_reserved), 10, "middle");
    svg.text(x + bar_w / 2, plot_top + plot_h + 18, bars[b].first, 10, "middle");
  }
  const double lx = left + double(bars.size()) * (bar_w + gap) + 20;
  for (std::size_t i = 0; i < std::size(kSegments); ++i) {
    svg.rect(lx, plot_top + 20.0 * double(i), 12, 12, kSegments[i].color);
    svg.text(lx + 18, plot_top + 20.0 * double(i) + 10, kSegments[i].name, 11);
  }
  return svg.finish();
}

}  // namespace stowage::estimate
