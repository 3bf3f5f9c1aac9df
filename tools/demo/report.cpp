#include "tools/demo/report.hpp"

#include <algorithm>
#include <bit>

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include "stowage/byte_size.hpp"

#include "tools/common/svg.hpp"
#include "tools/demo/estimate_bridge.hpp"
#include "tools/demo/savings.hpp"

namespace stowage::demo {

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
                     s.layers, s.hidden, s.heads, s.seq, s.batch, s.vocab, results.empty() ? 0 : results.front().params,
                     o.steps);
  const ConfigResult* base = find_baseline(results);
  out += fmt::format("{:<10} {:>8} {:>8} {:>8} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8}  {}\n", "config", "loss[0]",
                     "loss[-1]", "min loss", "peak alloc", "peak resvd", "saved", "predicted", "estimate", "step ms",
                     "bit-identical to baseline");
  for (const auto& r : results) {
    std::string saved, predicted, estimated;
    if (base != nullptr && &r != base) {
      saved = format_bytes(base->peak_allocated - r.peak_allocated);
      predicted = format_bytes(predicted_saving(r.techniques, o, r.params).bytes);
      estimated = format_bytes(estimated_saving(r.techniques, o.shape, o.rounding));
    }
    out += fmt::format("{:<10} {:>8.4f} {:>8.4f} {:>8.4f} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8.1f}  {}\n", r.name,
                       first(r), last(r), min_loss(r), format_bytes(r.peak_allocated), format_bytes(r.peak_reserved),
                       saved, predicted, estimated, r.mean_step_ms, identical_text(r));
  }
  out +=
      "saved: baseline peak allocated minus this one's, measured. predicted: the demo's own byte counts "
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
  j["schema"] = "stowage.demo/1";
  j["model"] = {{"layers", s.layers}, {"hidden", s.hidden}, {"heads", s.heads},
                {"seq", s.seq},       {"batch", s.batch},   {"vocab", s.vocab}};
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
  const double bar_h = 16, gap = 14, left = 110, width = 560, top = 48;
  const auto rows = static_cast<double>(results.size());
  double max_bytes = 1;
  for (const auto& r : results) max_bytes = std::max({max_bytes, double(r.peak_allocated), double(r.peak_reserved)});
  tools::SvgWriter svg(left + width + 140, top + rows * (2 * bar_h + gap) + 40);
  svg.text(10, 20,
           fmt::format("Peak device memory per configuration ({} layers, hidden {}, seq {}, batch {})", o.shape.layers,
                       o.shape.hidden, o.shape.seq, o.shape.batch),
           14);
  svg.rect(left, 28, 10, 10, "#3b6ea5");
  svg.text(left + 14, 37, "peak allocated");
  svg.rect(left + 120, 28, 10, 10, "#a8c3e0");
  svg.text(left + 134, 37, "peak reserved");
  double y = top;
  for (const auto& r : results) {
    const double wa = width * double(r.peak_allocated) / max_bytes;
    const double wr = width * double(r.peak_reserved) / max_bytes;
    svg.text(left - 8, y + bar_h + 4, r.name, 12, "end");
    svg.rect(left, y, wa, bar_h, "#3b6ea5", fmt::format("{}: peak allocated", r.name));
    svg.text(left + wa + 4, y + bar_h - 4, format_bytes(r.peak_allocated));
    svg.rect(left, y + bar_h, wr, bar_h, "#a8c3e0", fmt::format("{}: peak reserved", r.name));
    svg.text(left + wr + 4, y + 2 * bar_h - 4, format_bytes(r.peak_reserved));
    y += 2 * bar_h + gap;
  }
  return svg.finish();
}

}  // namespace stowage::demo
