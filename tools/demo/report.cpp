#include "tools/demo/report.hpp"

#include <algorithm>
#include <bit>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tools/demo/estimate_bridge.hpp"
#include "tools/demo/savings.hpp"

namespace stowage::demo {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::abs(b) >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} {}", b, units[u]) : fmt::format("{:.2f} {}", b, units[u]);
}

namespace {

float first(const ConfigResult& r) { return r.losses.empty() ? 0.0f : r.losses.front(); }
float last(const ConfigResult& r) { return r.losses.empty() ? 0.0f : r.losses.back(); }
float min_loss(const ConfigResult& r) {
  return r.losses.empty() ? 0.0f : *std::min_element(r.losses.begin(), r.losses.end());
}

std::string identical_text(const ConfigResult& r) {
  if (!r.compared) return "n/a (no baseline run)";
  if (r.name == "baseline") return "reference";
  if (r.bit_identical) return "yes (every step)";
  if (!r.must_match) return fmt::format("no, from step {}: half_up rounding differs by design", r.first_difference + 1);
  return fmt::format("NO (from step {})", r.first_difference + 1);
}

const ConfigResult* find_baseline(const std::vector<ConfigResult>& results) {
  for (const auto& r : results)
    if (r.name == "baseline") return &r;
  return nullptr;
}

}  // namespace

std::string format_table(const std::vector<ConfigResult>& results, const DemoOptions& o) {
  std::string out;
  const auto& s = o.shape;
  out += fmt::format("model: {} layers, hidden {}, {} heads, seq {}, batch {}, vocab {}; {} parameters; {} steps\n",
                     s.layers, s.hidden, s.heads, s.seq, s.batch, s.vocab,
                     results.empty() ? 0 : results.front().params, o.steps);
  const ConfigResult* base = find_baseline(results);
  out += fmt::format("{:<10} {:>8} {:>8} {:>8} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8}  {}\n", "config",
                     "loss[0]", "loss[-1]", "min loss", "peak alloc", "peak resvd", "saved", "predicted",
                     "estimate", "step ms", "bit-identical to baseline");
  for (const auto& r : results) {
    std::string saved, predicted, estimated;
    if (base != nullptr && &r != base) {
      saved = human_bytes(double(base->peak_allocated - r.peak_allocated));
      predicted = human_bytes(double(predicted_saving(r.techniques, o, r.params).bytes));
      estimated = human_bytes(double(estimated_saving(r.techniques, o.shape, o.rounding)));
    }
    out += fmt::format("{:<10} {:>8.4f} {:>8.4f} {:>8.4f} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8.1f}  {}\n",
                       r.name, first(r), last(r), min_loss(r), human_bytes(double(r.peak_allocated)),
                       human_bytes(double(r.peak_reserved)), saved, predicted, estimated, r.mean_step_ms,
                       identical_text(r));
  }
  out += "saved: baseline peak allocated minus this one's, measured. predicted: the demo's own byte counts "
         "(tools/demo/savings.cpp).\nestimate: `stowage estimate`'s model of the same shape (bf16 activations; "
         "offload counted as 12 B/param, the demo offloads m and v, 8 B/param).\n";
  out += "\n";
  for (const auto& r : results) {
    out += fmt::format("{}: {}\n", r.name, r.summary);
    for (const auto& d : r.details) out += fmt::format("    {}\n", d);
  }
  return out;
}

std::string to_json(const std::vector<ConfigResult>& results, const DemoOptions& o) {
  nlohmann::json j;
  const auto& s = o.shape;
  j["model"] = {{"layers", s.layers}, {"hidden", s.hidden}, {"heads", s.heads}, {"seq", s.seq},
                {"batch", s.batch},   {"vocab", s.vocab}};
  j["steps"] = o.steps;
  j["rounding"] = to_string(o.rounding);
  j["configs"] = nlohmann::json::array();
  for (const auto& r : results) {
    nlohmann::json c;
    c["name"] = r.name;
    c["summary"] = r.summary;
    c["details"] = r.details;
    c["parameters"] = r.params;
    c["losses"] = r.losses;
    std::vector<std::uint32_t> bits;
    for (float l : r.losses) bits.push_back(std::bit_cast<std::uint32_t>(l));
    c["loss_bits"] = bits;
    c["loss_first"] = first(r);
    c["loss_last"] = last(r);
    c["loss_min"] = min_loss(r);
    c["peak_allocated_bytes"] = r.peak_allocated;
    c["peak_reserved_bytes"] = r.peak_reserved;
    c["peak_requested_bytes"] = r.peak_requested;
    c["mean_step_ms"] = r.mean_step_ms;
    c["predicted_saving_bytes"] = predicted_saving(r.techniques, o, r.params).bytes;
    c["estimated_saving_bytes"] = estimated_saving(r.techniques, o.shape, o.rounding);
    c["final_master_fnv1a"] = fmt::format("{:016x}", r.master_hash);
    c["must_match_baseline"] = r.must_match;  // false: half_up rounding, differs by design
    if (r.compared) c["bit_identical_to_baseline"] = r.bit_identical;
    else c["bit_identical_to_baseline"] = nullptr;
    j["configs"].push_back(std::move(c));
  }
  return j.dump(2);
}

std::string to_svg(const std::vector<ConfigResult>& results, const DemoOptions& o) {
  const int bar_h = 16, gap = 14, left = 110, width = 560, top = 48;
  const int rows = static_cast<int>(results.size());
  const int height = top + rows * (2 * bar_h + gap) + 40;
  double max_bytes = 1;
  for (const auto& r : results) max_bytes = std::max({max_bytes, double(r.peak_allocated), double(r.peak_reserved)});
  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n"
      "<title>stowage demo: peak device memory per configuration</title>\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">Peak device memory per configuration "
      "({} layers, hidden {}, seq {}, batch {})</text>\n"
      "<rect x=\"{}\" y=\"28\" width=\"10\" height=\"10\" fill=\"#3b6ea5\"/><text x=\"{}\" y=\"37\">peak "
      "allocated</text>\n"
      "<rect x=\"{}\" y=\"28\" width=\"10\" height=\"10\" fill=\"#a8c3e0\"/><text x=\"{}\" y=\"37\">peak "
      "reserved</text>\n",
      left + width + 140, height, o.shape.layers, o.shape.hidden, o.shape.seq, o.shape.batch, left, left + 14,
      left + 120, left + 134);
  int y = top;
  for (const auto& r : results) {
    const double wa = width * double(r.peak_allocated) / max_bytes;
    const double wr = width * double(r.peak_reserved) / max_bytes;
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", left - 8, y + bar_h + 4, r.name);
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"#3b6ea5\"/>\n", left, y, wa,
                       bar_h);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\">{}</text>\n", left + wa + 4, y + bar_h - 4,
                       human_bytes(double(r.peak_allocated)));
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"#a8c3e0\"/>\n", left,
                       y + bar_h, wr, bar_h);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\">{}</text>\n", left + wr + 4, y + 2 * bar_h - 4,
                       human_bytes(double(r.peak_reserved)));
    y += 2 * bar_h + gap;
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace stowage::demo
