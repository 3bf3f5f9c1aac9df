// `stowage inspect`: snapshot and event-log analysis on small files in tests/data, the
// comparison of two snapshots, the timeline SVG, and bad input (exit code 2, position named).
// PyTorch's own snapshots: tools_inspect_pytorch_test.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/error.hpp"
#include "tools/common/json_input.hpp"
#include "tools/inspect/inspect_report.hpp"
#include "tools/inspect/pytorch_export.hpp"
#include "tools/inspect/pytorch_snapshot.hpp"
#include "tools/inspect/snapshot_consistency.hpp"
#include "tools_inspect_test_util.hpp"

using namespace stowage;
using namespace stowage::inspect;
using namespace stowage::testing;

TEST(InspectSnapshot, PeaksBlocksAndTags) {
  const SnapshotAnalysis a = analyze(load_snapshot(data("inspect_snapshot_a.json")));
  EXPECT_EQ(a.allocated, 13 * MiB);
  EXPECT_EQ(a.reserved, 22 * MiB);
  EXPECT_EQ(a.peak_allocated, 21 * MiB);
  EXPECT_EQ(a.peak_reserved, 22 * MiB);
  EXPECT_DOUBLE_EQ(a.fragmentation, 1.0 - 13.0 / 22.0);
  EXPECT_EQ(a.largest_free, 8 * MiB);
  ASSERT_EQ(a.largest_blocks.size(), 3u);
  EXPECT_EQ(a.largest_blocks[0].tag, "layer0.attn");
  EXPECT_EQ(a.largest_blocks[0].size, 8 * MiB);
  EXPECT_EQ(a.largest_blocks[1].tag, "layer0.mlp");
  EXPECT_EQ(a.largest_blocks[2].tag, "optimizer");
  // At the traced peak (21 MiB), the released activation still owned 8 MiB.
  ASSERT_EQ(a.tags_at_peak.size(), 4u);
  EXPECT_EQ(a.trace_peak_allocated, 21 * MiB);
  EXPECT_EQ(a.tags_at_peak[0].tag, "layer0.act");  // ties keep name order
  EXPECT_EQ(a.tags_at_peak[0].bytes, 8 * MiB);
  EXPECT_EQ(a.tags_at_peak[1].tag, "layer0.attn");
  EXPECT_EQ(a.tags_at_peak[2].bytes, 4 * MiB);
  EXPECT_EQ(a.tags_at_peak[3].bytes, 1 * MiB);
  ASSERT_EQ(a.tags_now.size(), 3u);
  EXPECT_EQ(a.tags_now[0].bytes, 8 * MiB);
  // Timeline: allocated and reserved before the first traced event, then after every one. The
  // activation stops counting at its free_requested, as allocated_bytes does (in stowage's
  // allocator and PyTorch's).
  ASSERT_EQ(a.timeline.size(), 9u);
  const std::int64_t alloc[] = {0, 0, 8, 12, 20, 20, 21, 13, 13};
  const std::int64_t res[] = {0, 20, 20, 20, 20, 22, 22, 22, 22};
  for (std::size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(a.timeline[i].allocated, alloc[i] * MiB) << i;
    EXPECT_EQ(a.timeline[i].reserved, res[i] * MiB) << i;
  }
  EXPECT_DOUBLE_EQ(a.fragmentation_at_peak, 1.0 - 21.0 / 22.0);
  EXPECT_EQ(a.largest_gap, 20 * MiB);  // the fresh segment before its first block
}

// The trace is a ring: when it starts mid-run, the timeline is anchored on the snapshot's
// current bytes and what was allocated before the window shows as "(before trace)".
TEST(InspectSnapshot, TraceThatStartsMidRun) {
  Snapshot s;
  s.stats.allocated_bytes.all.current = 10 * MiB;
  s.stats.reserved_bytes.all.current = 16 * MiB;
  s.trace.push_back({TraceAction::alloc, 0x1000, std::size_t(4 * MiB), Stream{}, 10, "grad"});
  s.trace.push_back({TraceAction::free_completed, 0x1000, std::size_t(4 * MiB), Stream{}, 20, "grad"});
  const SnapshotAnalysis a = analyze(s);
  ASSERT_EQ(a.timeline.size(), 3u);  // the state before the trace, then after each event
  EXPECT_EQ(a.timeline[0].allocated, 10 * MiB);
  EXPECT_EQ(a.timeline[1].allocated, 14 * MiB);
  EXPECT_EQ(a.timeline[2].allocated, 10 * MiB);
  EXPECT_EQ(a.timeline[0].reserved, 16 * MiB);
  EXPECT_EQ(a.timeline[0].time_ns, 10);
  EXPECT_EQ(a.timeline[0].events, 0);
  EXPECT_EQ(a.timeline[2].events, 2);
  EXPECT_EQ(a.trace_peak_allocated, 14 * MiB);
  ASSERT_EQ(a.tags_at_peak.size(), 2u);
  EXPECT_EQ(a.tags_at_peak[0].tag, "(before trace)");
  EXPECT_EQ(a.tags_at_peak[0].bytes, 10 * MiB);
  EXPECT_EQ(a.tags_at_peak[1].tag, "grad");
}

TEST(InspectSnapshot, CompareTwoSnapshots) {
  const SnapshotAnalysis a = analyze(load_snapshot(data("inspect_snapshot_a.json")));
  const SnapshotAnalysis b = analyze(load_snapshot(data("inspect_snapshot_b.json")));
  const auto j = compare_json(a, b);
  EXPECT_EQ(j["peak_allocated"]["change"].get<std::int64_t>(), -10 * MiB);
  EXPECT_EQ(j["reserved"]["change"].get<std::int64_t>(), -10 * MiB);
  ASSERT_EQ(j["tags"].size(), 3u);
  EXPECT_EQ(j["tags"][0]["tag"], "layer0.mlp");
  EXPECT_EQ(j["tags"][0]["change"].get<std::int64_t>(), -2 * MiB);
  EXPECT_TRUE(b.timeline.empty());
  auto cli = run_cli("inspect --compare " + data("inspect_snapshot_a.json") + " " + data("inspect_snapshot_b.json"));
  EXPECT_EQ(cli.exit_code, 0) << cli.output;
  EXPECT_NE(cli.output.find("layer0.mlp"), std::string::npos);
}

TEST(InspectEventLog, LiveBytesPeakAndLeaks) {
  const EventLogAnalysis a = analyze(load_event_log(data("inspect_events.csv")));
  EXPECT_EQ(a.events, 6);
  EXPECT_EQ(a.allocations, 3);
  EXPECT_EQ(a.frees, 3);
  EXPECT_EQ(a.unmatched_frees, 1);
  EXPECT_EQ(a.peak_live, 6 * MiB);
  EXPECT_DOUBLE_EQ(a.peak_time, 0.0004);
  EXPECT_EQ(a.live_at_end, 2 * MiB);
  EXPECT_EQ(a.live_blocks_at_end, 1);
  ASSERT_EQ(a.largest.size(), 3u);
  EXPECT_EQ(a.largest[0].size, std::size_t(4 * MiB));
  EXPECT_TRUE(looks_like_event_log(data("inspect_events.csv")));
  EXPECT_FALSE(looks_like_event_log(data("inspect_snapshot_a.json")));
}

TEST(InspectOutput, SvgTimelinesAreWellFormedXml) {
  const std::string snap_svg = temp_file("snapshot.svg", "");
  const std::string log_svg = temp_file("events.svg", "");
  EXPECT_EQ(run_cli("inspect " + data("inspect_snapshot_a.json") + " --svg " + snap_svg).exit_code, 0);
  EXPECT_EQ(run_cli("inspect " + data("inspect_events.csv") + " --svg " + log_svg).exit_code, 0);
  const std::string svg = slurp(snap_svg);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(svg.find("reserved"), std::string::npos);
  if (std::system("command -v xmllint >/dev/null 2>&1") != 0) GTEST_SKIP() << "xmllint not installed";
  EXPECT_EQ(std::system(("xmllint --noout " + snap_svg + " " + log_svg).c_str()), 0);
}

TEST(InspectOutput, JsonCarriesPeaksAndTimeline) {
  auto r = run_cli("inspect --json " + data("inspect_snapshot_a.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["schema"], "stowage.inspect/1");
  EXPECT_EQ(j["peak_allocated"].get<std::int64_t>(), 21 * MiB);
  EXPECT_EQ(j["timeline"].size(), 9u);  // the trace's start and its 8 events
  EXPECT_EQ(j["tags_at_peak"][0]["tag"], "layer0.act");
}

TEST(InspectBadInput, ExitCodeTwoWithThePosition) {
  const std::string good = slurp(data("inspect_snapshot_a.json"));
  auto expect_error = [](const std::string& path, const std::string& needle) {
    auto r = run_cli("inspect " + path);
    EXPECT_EQ(r.exit_code, 2) << path << ": " << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << path << ": " << r.output;
  };
  expect_error(temp_file("truncated.json", good.substr(0, good.size() / 2)), "byte");
  std::string wrong_type = good;
  wrong_type.replace(wrong_type.find("\"size\": 8388608"), 15, "\"size\": \"big\"");
  expect_error(temp_file("wrong_type.json", wrong_type), "blocks[0].size");
  expect_error(temp_file("deep.json", std::string(10000, '[') + std::string(10000, ']')), "deeper than");
  expect_error(temp_file("not_object.json", "42"), "snapshot");
  expect_error(temp_file("binary.json", std::string("\x00\xff\xfe{", 4)), "byte");
  expect_error(temp_file("bad_action.csv",
                         "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x10,64,0\n1,0.2,steal,0x10,64,0\n"),
               "line 3");
  expect_error(temp_file("short_line.csv", "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x10\n"), "line 2");
  expect_error(temp_file("huge_size.csv",
                         "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x10,99999999999999999999999,0\n"),
               "line 2");
  expect_error(std::string(STOWAGE_BINARY_DIR) + "/no_such_file.json", "no_such_file");
  auto none = run_cli("inspect");
  EXPECT_EQ(none.exit_code, 2);
  // Oversized input is refused before parsing.
  const std::string path = temp_file("big.json", std::string(64, ' '));
  EXPECT_THROW(tools::read_file(path, 16), ParseError);
}

// End to end with the real allocator: a traced run on an emulated device, its snapshot written
// by stowage::to_json, read back by inspect.
TEST(InspectSnapshot, RealAllocatorSnapshot) {
  EmulatedOptions dev_options;
  dev_options.capacity = 64 * MiB;
  auto device = make_emulated_device(0, dev_options);
  AllocatorOptions options;
  options.trace_entries = 1000;
  CachingAllocator alloc(*device, options);
  void* weights = nullptr;
  void* act = nullptr;
  {
    ScopedTag tag("weights");
    weights = alloc.allocate(6 * MiB);
  }
  {
    ScopedTag tag("activations");
    act = alloc.allocate(10 * MiB);
  }
  alloc.deallocate(act);
  const std::string path = temp_file("real_snapshot.json", to_json(alloc.snapshot()));
  const SnapshotAnalysis a = analyze(load_snapshot(path));
  EXPECT_EQ(a.allocated, 6 * MiB);
  EXPECT_EQ(a.peak_allocated, 16 * MiB);
  EXPECT_GE(a.reserved, 16 * MiB);
  EXPECT_EQ(a.trace_peak_allocated, 16 * MiB);
  ASSERT_GE(a.tags_at_peak.size(), 2u);
  EXPECT_EQ(a.tags_at_peak[0].tag, "activations");
  EXPECT_EQ(a.tags_at_peak[0].bytes, 10 * MiB);
  EXPECT_EQ(a.tags_at_peak[1].tag, "weights");
  ASSERT_FALSE(a.largest_blocks.empty());
  EXPECT_EQ(a.largest_blocks[0].tag, "weights");
  EXPECT_EQ(a.timeline.back().allocated, 6 * MiB);
  alloc.deallocate(weights);
}

namespace {

// A consistent snapshot whose trace has `small` 4 KiB alloc/free pairs with one 64 MiB block
// allocated and freed in the middle: the spike a thinned timeline must keep.
Snapshot spiky_snapshot(int small) {
  Snapshot s;
  s.device_name = "emulated";
  s.capacity = 1024 * MiB;
  const std::size_t seg = 128 * MiB;
  s.stats.reserved_bytes.all = s.stats.reserved_bytes.large_pool =
      Stat{std::int64_t(seg), std::int64_t(seg), std::int64_t(seg), 0};
  s.stats.allocated_bytes.all.peak = 64 * MiB + 4096;
  s.stats.allocated_bytes.all.allocated = 64 * MiB + 4096LL * small;
  s.stats.allocated_bytes.all.freed = s.stats.allocated_bytes.all.allocated;
  SegmentInfo info;
  info.address = 0x7f0000000000;
  info.total_size = seg;
  info.blocks.push_back({info.address, seg, 0, BlockState::inactive, Stream{}, ""});
  s.segments.push_back(info);
  std::int64_t t = 1000;
  s.trace.push_back({TraceAction::segment_map, info.address, seg, Stream{}, t++, ""});
  for (int i = 0; i < small; ++i) {
    if (i == small / 2) {
      s.trace.push_back({TraceAction::alloc, info.address + 4096, 64 * MiB, Stream{}, t++, "spike"});
      s.trace.push_back({TraceAction::free_completed, info.address + 4096, 64 * MiB, Stream{}, t++, "spike"});
    }
    s.trace.push_back({TraceAction::alloc, info.address, 4096, Stream{}, t++, "small"});
    s.trace.push_back({TraceAction::free_completed, info.address, 4096, Stream{}, t++, "small"});
  }
  return s;
}

}  // namespace

TEST(InspectOutput, AThinnedTimelineKeepsItsPeak) {
  const std::string path = temp_file("spiky.json", to_json(spiky_snapshot(20000)));
  const SnapshotAnalysis a = analyze(load_snapshot(path));
  EXPECT_EQ(a.trace_peak_allocated, 64 * MiB);  // the spike alone: the 4 KiB block was freed first
  ASSERT_GT(a.timeline.size(), 40000u);
  auto r = run_cli("inspect --json " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  ASSERT_LE(j["timeline"].size(), 2002u);  // thinned
  std::int64_t highest = 0;
  for (const auto& p : j["timeline"]) highest = std::max(highest, p["allocated"].get<std::int64_t>());
  EXPECT_EQ(highest, 64 * MiB);
  EXPECT_EQ(j["timeline"].front()["time_ns"], 1000);  // the first point stays
  // The SVG's allocated line reaches the spike: its highest point is the spike's height.
  const std::string svg_path = temp_file("spiky.svg", "");
  ASSERT_EQ(run_cli("inspect " + path + " --svg " + svg_path).exit_code, 0);
  const std::string svg = slurp(svg_path);
  const auto line = svg.find("<polyline");
  ASSERT_NE(line, std::string::npos);
  const auto points_at = svg.find("points=\"", line) + 8;
  std::istringstream points(svg.substr(points_at, svg.find('"', points_at) - points_at));
  double lowest_y = 1e9;  // SVG y grows downwards
  std::string pair;
  while (points >> pair) lowest_y = std::min(lowest_y, std::stod(pair.substr(pair.find(',') + 1)));
  // y_max is the reserved 128 MiB; the chart is 300 high from y = 50: 64 MiB is at 50 + 150.
  EXPECT_NEAR(lowest_y, 200.0, 0.05) << svg.substr(line, 300);
  // Both axes carry tick labels: bytes and time.
  EXPECT_NE(svg.find(">128.00 MiB<"), std::string::npos);
  EXPECT_NE(svg.find(">0<"), std::string::npos);
}

TEST(InspectOutput, ExtremeValuesStayReadable) {
  // A size of 2^64 - 1 is not "-1 B"; a time of 1e308 gives no nan or inf coordinates.
  const std::string log = temp_file("extreme.csv",
                                    "Thread,Time,Action,Pointer,Size,Stream\n"
                                    "1,0.5,allocate,0x1000,18446744073709551615,0\n"
                                    "1,1e308,allocate,0x2000,4096,0\n"
                                    "1,1e308,free,0x1000,18446744073709551615,0\n");
  const std::string svg_path = temp_file("extreme.svg", "");
  auto r = run_cli("inspect " + log + " --svg " + svg_path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("-1 B"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("TiB"), std::string::npos) << r.output;
  const std::string svg = slurp(svg_path);
  for (const char* bad : {"nan", "inf", "-nan"}) EXPECT_EQ(svg.find(bad), std::string::npos) << bad << "\n" << svg;
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
}

TEST(InspectBadInput, AnInconsistentSnapshotIsRefusedWithWhatIsWrong) {
  const Snapshot good = spiky_snapshot(3);
  ASSERT_TRUE(analyze(good).timeline.size() > 0);
  auto refused = [](Snapshot s, const std::string& needle) {
    const std::string path = temp_file("inconsistent.json", to_json(s));
    auto r = run_cli("inspect " + path);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("not a consistent snapshot"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
  };
  Snapshot s = good;
  s.stats.allocated_bytes.all.peak = -5;  // a negative peak
  refused(s, "stats.allocated_bytes.all has a negative value");
  s = good;
  s.stats.reserved_bytes.all.peak = 1;  // below current
  refused(s, "stats.reserved_bytes.all: peak 1 is below current");
  s = good;
  s.stats.allocated_bytes.all.current = s.stats.allocated_bytes.all.peak = 256 * MiB;
  refused(s, "exceed reserved_bytes");
  s = good;
  s.segments[0].blocks[0].size -= 512;
  refused(s, "blocks add up to");
  s = good;
  s.segments[0].blocks[0].address += 512;
  refused(s, "starts at");
  EXPECT_EQ(run_cli("inspect " + temp_file("consistent.json", to_json(good))).exit_code, 0);
}

// An expandable segment lists its mapped blocks run by run, unmapped holes left out
// (docs/snapshot.md): its blocks need not tile it, only lie in order from its address without
// overlapping, adding up to total_size. A classic segment's must tile it.
TEST(InspectBadInput, ExpandableSegmentsMayHaveHolesClassicOnesMayNot) {
  Snapshot good = spiky_snapshot(3);
  const std::uintptr_t base = good.segments[0].address;
  good.segments[0].expandable = true;
  good.segments[0].blocks = {{base + 2 * MiB, 30 * MiB, 0, BlockState::inactive, Stream{}, ""},    // a hole before
                             {base + 64 * MiB, 98 * MiB, 0, BlockState::inactive, Stream{}, ""}};  // and between
  EXPECT_EQ(inconsistencies(good), std::vector<std::string>{});
  auto r = run_cli("inspect " + temp_file("holes.json", to_json(good)));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto problems = [&](void (*edit)(Snapshot&)) {
    Snapshot s = good;
    edit(s);
    return inconsistencies(s);
  };
  using Problems = std::vector<std::string>;
  EXPECT_EQ(problems([](Snapshot& s) { s.segments[0].blocks[0].address = s.segments[0].address - 4096; }),
            Problems{"segments[0].blocks[0] starts at 0x7efffffff000, below its expandable segment's address "
                     "0x7f0000000000"});
  EXPECT_EQ(problems([](Snapshot& s) { s.segments[0].blocks[1].address = s.segments[0].address + 32 * MiB - 512; }),
            Problems{"segments[0].blocks[1] starts at 0x7f0001fffe00, inside the one before (which ends at "
                     "0x7f0002000000)"});
  EXPECT_EQ(problems([](Snapshot& s) { s.segments[0].blocks[1].size -= 512; }),
            Problems{"segments[0]: its 2 blocks add up to 134217216 bytes, not its total_size 134217728"});
  EXPECT_EQ(problems([](Snapshot& s) { s.segments[0].blocks[1].address = std::uintptr_t(-1) - 4095; }),
            Problems{"segments[0].blocks[1] at 0xfffffffffffff000 with 102760448 bytes ends past the address "
                     "space"});
  // The same blocks in a classic segment: refused at the first hole, once; sizes that add up
  // are not reported as a sum cut off at the hole.
  EXPECT_EQ(problems([](Snapshot& s) { s.segments[0].expandable = false; }),
            Problems{"segments[0].blocks[0] starts at 0x7f0000200000, not at its segment's address 0x7f0000000000"});
  EXPECT_EQ(problems([](Snapshot& s) {
              s.segments[0].expandable = false;
              s.segments[0].blocks[0] = {s.segments[0].address, 32 * MiB, 0, BlockState::inactive, Stream{}, ""};
              s.segments[0].blocks[1].size = 96 * MiB;  // 128 MiB in all, as total_size says
            }),
            Problems{"segments[0].blocks[1] starts at 0x7f0004000000, not where the one before ends "
                     "(0x7f0002000000)"});
  Snapshot classic = good;
  classic.segments[0].expandable = false;
  r = run_cli("inspect " + temp_file("classic_hole.json", to_json(classic)));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("not at its segment's address"), std::string::npos) << r.output;
}

// The default configuration (expandable segments) with a block freed between two live ones and
// given back by empty_cache, as stowage.dump_snapshot writes it: inspect reads it, compares it and
// exports it for memory_viz as PyTorch reports one, a segment per contiguous mapped run.
TEST(InspectSnapshot, ExpandableSegmentWithAnUnmappedHole) {
  auto device = make_emulated_device(0, EmulatedOptions{.capacity = std::size_t(256 * MiB)});
  AllocatorOptions options;
  options.trace_entries = 1000;
  CachingAllocator alloc(*device, options);
  ASSERT_EQ(alloc.segment_mode(), SegmentMode::expandable);
  void* a = alloc.allocate(12 * MiB);
  void* b = alloc.allocate(12 * MiB);
  void* c = alloc.allocate(12 * MiB);
  alloc.deallocate(b);
  alloc.empty_cache();
  const Snapshot original = alloc.snapshot();
  ASSERT_EQ(original.segments.size(), 1u);
  const SegmentInfo& seg = original.segments[0];
  ASSERT_TRUE(seg.expandable);
  ASSERT_EQ(seg.blocks.size(), 2u);
  EXPECT_EQ(seg.blocks[0].address, reinterpret_cast<std::uintptr_t>(a));
  EXPECT_EQ(seg.blocks[1].address, reinterpret_cast<std::uintptr_t>(c));
  EXPECT_EQ(seg.blocks[1].address - seg.blocks[0].address, std::uintptr_t(24 * MiB));  // b's 12 MiB unmapped
  EXPECT_EQ(seg.total_size, std::size_t(24 * MiB));

  const std::string path = temp_file("hole_snapshot.json", to_json(original));
  auto r = run_cli("inspect " + path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(analyze(load_snapshot(path)).allocated, 24 * MiB);
  r = run_cli("inspect --json --compare " + path + " " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["allocated"]["b"], 24 * MiB) << r.output;

  const nlohmann::json viz = to_pytorch(original);
  ASSERT_EQ(viz["segments"].size(), 2u) << viz["segments"].dump();
  for (std::size_t i = 0; i < 2; ++i) {
    const nlohmann::json& run = viz["segments"][i];
    EXPECT_EQ(run["address"], seg.blocks[i].address);
    EXPECT_EQ(run["total_size"], 12 * MiB);
    EXPECT_EQ(run["allocated_size"], 12 * MiB);
    EXPECT_EQ(run["is_expandable"], true);
    ASSERT_EQ(run["blocks"].size(), 1u);
    EXPECT_EQ(run["blocks"][0]["address"], seg.blocks[i].address);
  }
  const std::string out = std::string(STOWAGE_BINARY_DIR) + "/tools_inspect_test_hole.pickle";
  r = run_cli("inspect " + path + " --to-memory-viz " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Snapshot back = load_snapshot(out);
  ASSERT_EQ(back.segments.size(), 2u);
  EXPECT_EQ(back.segments[0].address, reinterpret_cast<std::uintptr_t>(a));
  EXPECT_EQ(back.segments[1].address, reinterpret_cast<std::uintptr_t>(c));
  EXPECT_EQ(analyze(back).allocated, 24 * MiB);
  alloc.deallocate(a);
  alloc.deallocate(c);
  // Nothing mapped: PyTorch reports no segment, and neither does the export.
  alloc.empty_cache();
  const Snapshot empty = alloc.snapshot();
  EXPECT_EQ(inconsistencies(empty), std::vector<std::string>{});
  EXPECT_EQ(to_pytorch(empty)["segments"].size(), 0u);
}

namespace {

// Four steps of 1 ms each from t = 1000 ns (the first traced event), every step tagged "step i"
// on its first allocation, with nested tags in between ("step i/attn" names the same step,
// "layer0.mlp" none), tags that name no step ("stepping", a PyTorch frame label "step_9 (…)"),
// and the trace ending at 1000 + 4 ms: step i starts at x = left + w · i / 4 in the chart.
Snapshot stepped_snapshot() {
  Snapshot s;
  s.device_name = "emulated";
  s.capacity = 1024 * MiB;
  const std::size_t seg = 2 * MiB;
  s.stats.reserved_bytes.all = s.stats.reserved_bytes.large_pool =
      Stat{std::int64_t(seg), std::int64_t(seg), std::int64_t(seg), 0};
  s.stats.allocated_bytes.all.peak = 3 * 4096;
  SegmentInfo info;
  info.address = 0x7f0000000000;
  info.total_size = seg;
  info.blocks.push_back({info.address, seg, 0, BlockState::inactive, Stream{}, ""});
  s.segments.push_back(info);
  const std::int64_t t0 = 1000, ms = 1000000;
  s.trace.push_back({TraceAction::segment_map, info.address, seg, Stream{}, t0, ""});
  const char* others[] = {"layer0.mlp", "stepping", "step_9 (train.py:10)"};
  for (int i = 0; i < 4; ++i) {
    const std::int64_t t = t0 + i * ms;
    const std::string step = fmt::format("step {}", i);
    s.trace.push_back({TraceAction::alloc, info.address, 4096, Stream{}, t, step});
    s.trace.push_back({TraceAction::alloc, info.address + 4096, 4096, Stream{}, t + 1000, others[i % 3]});
    s.trace.push_back({TraceAction::alloc, info.address + 8192, 4096, Stream{}, t + 2000, step + "/attn"});
    for (int k = 0; k < 3; ++k)
      s.trace.push_back({TraceAction::free_completed, info.address + 4096 * std::uintptr_t(k), 4096, Stream{},
                         t + 3000 + k, k == 1 ? others[(i + 1) % 3] : step.c_str()});
  }
  s.trace.push_back({TraceAction::alloc, info.address, 4096, Stream{}, t0 + 4 * ms, ""});
  s.trace.push_back({TraceAction::free_completed, info.address, 4096, Stream{}, t0 + 4 * ms, ""});
  s.stats.allocated_bytes.all.allocated = s.stats.allocated_bytes.all.freed = 13 * 4096;
  return s;
}

// The x1 of every step-mark line in an SVG (their stroke is the mark colour).
std::vector<double> mark_lines(const std::string& svg) {
  std::vector<double> xs;
  for (std::size_t at = svg.find("<line "); at != std::string::npos; at = svg.find("<line ", at + 1)) {
    const std::string element = svg.substr(at, svg.find("/>", at) - at);
    if (element.find("stroke=\"#b07aa1\"") == std::string::npos) continue;
    const auto x1 = element.find("x1=\"") + 4;
    xs.push_back(std::stod(element.substr(x1, element.find('"', x1) - x1)));
  }
  return xs;
}

}  // namespace

TEST(InspectSteps, TagsNameSteps) {
  EXPECT_EQ(step_of_tag("step 3"), 3);
  EXPECT_EQ(step_of_tag("step3"), 3);
  EXPECT_EQ(step_of_tag("Step_12/attn"), 12);
  EXPECT_EQ(step_of_tag("STEP:7.fwd"), 7);
  EXPECT_EQ(step_of_tag("step#0"), 0);
  EXPECT_EQ(step_of_tag("step 3:fwd"), 3);
  for (const char* none : {"", "step", "step ", "stepping", "step x", "step 3 (train.py:10)", "step_3b", "steps 3",
                           "layer3.step 4", "step 1234567890123456789"})
    EXPECT_EQ(step_of_tag(none), -1) << none;
}

// Step marks: one per step, where its first tagged event is; nested tags and tags that name no
// step add none. In the analysis, the JSON, the table and the SVG (a line at the step's x).
TEST(InspectSteps, MarksOnTheTimeline) {
  const Snapshot s = stepped_snapshot();
  const SnapshotAnalysis a = analyze(s);
  ASSERT_EQ(a.steps.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(a.steps[i].step, std::int64_t(i));
    EXPECT_EQ(a.steps[i].time_ns, 1000 + std::int64_t(i) * 1000000);
  }
  const std::string path = temp_file("stepped.json", to_json(s));
  auto r = run_cli("inspect --json " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j["steps"].size(), 4u);
  EXPECT_EQ(j["steps"][2]["step"], 2);
  EXPECT_EQ(j["steps"][2]["time_ns"], 2001000);
  auto table = run_cli("inspect " + path);
  EXPECT_NE(table.output.find("steps: 4 marked, step 0 to step 3"), std::string::npos) << table.output;

  const std::string svg_path = temp_file("stepped.svg", "");
  ASSERT_EQ(run_cli("inspect " + path + " --svg " + svg_path).exit_code, 0);
  const std::string svg = slurp(svg_path);
  // The chart spans x 90..730 for 0..4 ms: steps at 90, 250, 410, 570.
  const std::vector<double> xs = mark_lines(svg);
  ASSERT_EQ(xs.size(), 4u) << svg;
  for (std::size_t i = 0; i < 4; ++i) EXPECT_NEAR(xs[i], 90.0 + 160.0 * double(i), 0.05) << i;
  for (int i = 0; i < 4; ++i) EXPECT_NE(svg.find(fmt::format(">step {}<", i)), std::string::npos) << i;
  EXPECT_EQ(svg.find(">step 9<"), std::string::npos);
  if (std::system("command -v xmllint >/dev/null 2>&1") == 0)
    EXPECT_EQ(std::system(("xmllint --noout " + svg_path).c_str()), 0);

  // Exported for memory_viz and read back, the tags (as stowage tag frames) still name the steps.
  const std::string viz = temp_file("stepped_viz.json", to_pytorch(s).dump());
  EXPECT_EQ(analyze(load_snapshot(viz)).steps.size(), 4u);
}

// A free is marked in the step that made it, not the one that allocated the block: the trace
// tags each event with the tag of the thread that caused it.
TEST(InspectSteps, AFreeMarksTheStepThatMadeIt) {
  auto device = make_emulated_device(0, EmulatedOptions{.capacity = std::size_t(64 * MiB)});
  AllocatorOptions options;
  options.trace_entries = 100;
  CachingAllocator alloc(*device, options);
  void* p = nullptr;
  {
    ScopedTag tag("step 0");
    p = alloc.allocate(4096);
  }
  {
    ScopedTag tag("step 1");
    alloc.deallocate(p);  // the only event of step 1
  }
  const std::string path = temp_file("free_step.json", to_json(alloc.snapshot()));
  const SnapshotAnalysis a = analyze(load_snapshot(path));
  ASSERT_EQ(a.steps.size(), 2u);
  EXPECT_EQ(a.steps[0].step, 0);
  EXPECT_EQ(a.steps[1].step, 1);
  auto r = run_cli("inspect " + path);
  EXPECT_NE(r.output.find("steps: 2 marked, step 0 to step 1"), std::string::npos) << r.output;
}

// Many steps: every mark is found in one pass, the SVG draws at most one line per pixel column
// and the JSON lists at most about 2000.
TEST(InspectSteps, ManyStepsStayCheap) {
  Snapshot s = stepped_snapshot();
  s.trace.resize(1);  // the segment_map
  const std::size_t seg = 2 * MiB;
  const std::int64_t n = 100000;
  for (std::int64_t i = 0; i < n; ++i) {
    s.trace.push_back(
        {TraceAction::alloc, s.segments[0].address, 4096, Stream{}, 2000 + 2 * i, fmt::format("step {}", i)});
    s.trace.push_back({TraceAction::free_completed, s.segments[0].address, 4096, Stream{}, 2001 + 2 * i, ""});
  }
  s.stats.allocated_bytes.all.peak = 4096;
  s.stats.allocated_bytes.all.allocated = s.stats.allocated_bytes.all.freed = 4096 * n;
  ASSERT_EQ(s.stats.reserved_bytes.all.current, std::int64_t(seg));
  const SnapshotAnalysis a = analyze(s);
  EXPECT_EQ(a.steps.size(), std::size_t(n));
  const std::vector<double> xs = mark_lines(timeline_svg(a, "many"));
  EXPECT_GT(xs.size(), 600u);
  EXPECT_LE(xs.size(), 641u);
  for (std::size_t i = 1; i < xs.size(); ++i) EXPECT_GE(xs[i] - xs[i - 1], 0.89);  // a pixel, printed to 0.1
  const auto j = to_json(a);
  EXPECT_LE(j["steps"].size(), 2000u);
  EXPECT_GT(j["steps"].size(), 1900u);
}
