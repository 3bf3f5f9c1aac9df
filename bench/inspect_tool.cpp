// How long `stowage inspect` takes on a large snapshot: a consistent snapshot of a traced run
// written by the allocator's own writer (about 64 MiB of JSON, the inspect limit), then read,
// checked, analysed, and rendered as JSON and SVG, as the command does. The peer is the plain
// JSON parse of the same text (nlohmann-json), the floor any reader pays. Target (issue 20):
// under 3 s. Prints markdown.
//
//   inspect_tool [--quick]        (--quick: a 16 MiB snapshot)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "stowage/snapshot.hpp"
#include "tools/inspect/inspect_report.hpp"
#include "tools/inspect/snapshot_analysis.hpp"

using namespace stowage;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A run of `steps` training-like steps: each allocates `per_step` activations of varying size
// under per-layer tags and frees them in reverse, in one 4 GiB segment.
Snapshot traced_run(int steps, int per_step) {
  Snapshot s;
  s.device_name = "emulated";
  s.capacity = std::size_t{8} << 30;
  const std::size_t seg = std::size_t{4} << 30;
  s.stats.reserved_bytes.all = s.stats.reserved_bytes.large_pool =
      Stat{std::int64_t(seg), std::int64_t(seg), std::int64_t(seg), 0};
  SegmentInfo info;
  info.address = 0x7f0000000000;
  info.total_size = seg;
  info.blocks.push_back({info.address, seg, 0, BlockState::inactive, Stream{}, ""});
  s.segments.push_back(info);
  std::int64_t t = 0, peak = 0;
  s.trace.push_back({TraceAction::segment_map, info.address, seg, Stream{}, t++, ""});
  for (int step = 0; step < steps; ++step) {
    std::vector<std::pair<std::uintptr_t, std::size_t>> live;
    std::uintptr_t at = info.address;
    std::int64_t bytes = 0;
    for (int i = 0; i < per_step; ++i) {
      const std::size_t size = std::size_t(512) << ((step + i) % 14);  // 512 B to 4 MiB
      live.emplace_back(at, size);
      s.trace.push_back({TraceAction::alloc, at, size, Stream{}, t++, fmt::format("layer{}.act", i % 48)});
      at += size;
      bytes += std::int64_t(size);
      peak = std::max(peak, bytes);
    }
    for (auto it = live.rbegin(); it != live.rend(); ++it)
      s.trace.push_back({TraceAction::free_completed, it->first, it->second, Stream{}, t++, ""});
  }
  s.stats.allocated_bytes.all.peak = peak;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const std::size_t target = quick ? std::size_t{16} << 20 : std::size_t{62} << 20;
  // Size the run so the JSON lands just under the target (about 150 bytes per trace entry).
  int steps = int(target / 150 / 2 / 512);
  std::string text;
  for (;;) {
    text = to_json(traced_run(steps, 512));
    if (text.size() <= target) break;
    steps = int(double(steps) * double(target) / double(text.size()) * 0.98);
  }
  const std::string path = "/tmp/stowage_inspect_tool_snapshot.json";
  std::ofstream(path, std::ios::binary) << text;

  auto t0 = std::chrono::steady_clock::now();
  const nlohmann::json parsed = nlohmann::json::parse(text);
  const double parse_s = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  const Snapshot snap = inspect::load_snapshot(path);
  const double load_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const inspect::SnapshotAnalysis a = inspect::analyze(snap, 10);
  const double analyze_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const std::string json = inspect::to_json(a).dump();
  const std::string table = inspect::to_table(a);
  const std::string svg = inspect::timeline_svg(a, "timeline");
  const double render_s = seconds_since(t0);
  const double total = load_s + analyze_s + render_s;
  std::remove(path.c_str());

  std::printf(
      "| snapshot | trace entries | read + check | analyse | render (JSON, table, SVG) | inspect total | plain JSON "
      "parse (peer) | total / parse |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  std::printf("| %.1f MiB | %zu | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.2fx |\n",
              double(text.size()) / (1 << 20), snap.trace.size(), load_s, analyze_s, render_s, total, parse_s,
              total / parse_s);
  std::printf("\ntrace peak %lld bytes; %zu timeline points; JSON %zu bytes, SVG %zu bytes\n",
              static_cast<long long>(a.trace_peak_allocated), a.timeline.size(), json.size(), svg.size());
  return parsed.is_object() && total > 0 ? 0 : 1;
}
