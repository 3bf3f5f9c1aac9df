// `stowage inspect` on the forms real PyTorch snapshots take: free blocks with a stale requested
// size, a trace that starts mid-run, PyTorch 2.0's block history, traces without times, several
// devices, and the export that memory_viz's JavaScript reads. The data files come from
// tests/data/make_pytorch_snapshot.py (reproducers of an outside check against 15 snapshots
// from public repositories).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"
#include "tools/inspect/inspect_report.hpp"
#include "tools/inspect/pickle_reader.hpp"
#include "tools/inspect/pytorch_snapshot.hpp"
#include "tools/inspect/snapshot_consistency.hpp"
#include "tools_inspect_test_util.hpp"

using namespace stowage;
using namespace stowage::inspect;
using namespace stowage::testing;

namespace {

nlohmann::json inspect_json(const std::string& args) {
  const auto r = run_cli("inspect --json " + args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
}

// `inspect FILE --to-memory-viz OUT` read back as the dict it pickles.
nlohmann::json memory_viz_of(const std::string& file, const std::string& name) {
  const std::string out = std::string(STOWAGE_BINARY_DIR) + "/tools_inspect_test_" + name + ".pickle";
  const auto r = run_cli("inspect " + file + " --to-memory-viz " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return read_pickle(slurp(out), out);
}

std::vector<std::int64_t> column(const nlohmann::json& points, const char* key) {
  std::vector<std::int64_t> out;
  for (const auto& p : points) out.push_back(p.at(key).get<std::int64_t>());
  return out;
}

}  // namespace

// PyTorch's allocator splits a free block and leaves the remainder the requested size of the
// block's earlier allocation (CUDACachingAllocator.cpp: `remaining->size -= size;`), which its
// snapshot reports: a free block may have "requested" more than its size. It was refused.
TEST(InspectPyTorchForms, AFreeBlockKeepsAStaleRequestedSize) {
  const Snapshot s = load_snapshot(data("pytorch_stale_requested.pickle"));
  ASSERT_EQ(s.segments.at(0).blocks.size(), 2u);
  EXPECT_EQ(s.segments[0].blocks[0].requested_size, 19398656u);
  EXPECT_EQ(s.segments[0].blocks[1].state, BlockState::inactive);
  EXPECT_EQ(s.segments[0].blocks[1].requested_size, 0u);  // not the stale 9 MiB
  EXPECT_EQ(s.stats.requested_bytes.all.current, 19398656);
  EXPECT_EQ(analyze(s).allocated, 19398656);
  const nlohmann::json viz = memory_viz_of(data("pytorch_stale_requested.pickle"), "stale");
  EXPECT_EQ(viz["segments"][0]["blocks"][1]["requested_size"], 0);
  EXPECT_EQ(viz["segments"][0]["requested_size"], 19398656);
  // The rule still holds for blocks in use, allocated or pending free.
  for (const BlockState state : {BlockState::active_allocated, BlockState::active_pending_free, BlockState::inactive}) {
    Snapshot t;
    t.segments.push_back({0x1000, 512, 0, 0, Pool::small, Stream{}, false, {}});
    t.segments[0].blocks.push_back({0x1000, 512, 1024, state, Stream{}, ""});
    const auto problems = inconsistencies(t);
    if (state == BlockState::inactive) {
      EXPECT_TRUE(problems.empty()) << problems.front();
    } else {
      ASSERT_EQ(problems.size(), 1u) << to_string(state);
      EXPECT_EQ(problems[0], "segments[0].blocks[0]: requested 1024 bytes, more than its size 512");
    }
  }
}

// The trace is a ring: what was allocated before its first entry is the state the timeline
// starts from (the snapshot's state with the trace's events undone), and it may be the peak.
TEST(InspectPyTorchForms, TheStateBeforeTheTraceIsItsFirstPoint) {
  const nlohmann::json j = inspect_json(data("pytorch_ring_start.pickle"));
  EXPECT_EQ(j["peak_allocated"], 11 * MiB);
  EXPECT_EQ(j["trace_peak_allocated"], 11 * MiB);
  EXPECT_DOUBLE_EQ(j["fragmentation_at_peak"].get<double>(), 1.0 - 11.0 / 20.0);
  EXPECT_EQ(j["largest_gap"], 19 * MiB);
  EXPECT_EQ(j["tags_at_peak"], nlohmann::json::array({{{"tag", "(before trace)"}, {"bytes", 11 * MiB}}}));
  EXPECT_EQ(column(j["timeline"], "allocated"), (std::vector<std::int64_t>{11 * MiB, MiB, MiB}));
  EXPECT_EQ(column(j["timeline"], "events"), (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_EQ(column(j["timeline"], "time_ns"), (std::vector<std::int64_t>{10000, 10000, 11000}));
  const auto r = run_cli("inspect " + data("pytorch_ring_start.pickle"));
  EXPECT_NE(r.output.find("  trace: 2 events, allocated peak 11.00 MiB with 45.0% of reserved free; largest "
                          "reserved-but-free gap 19.00 MiB\n"),
            std::string::npos)
      << r.output;
}

// memory_viz's annotate_snapshot (PyTorch main) runs `snapshot.categores.push('unknown')`, a
// typo that throws, when trace entries carry categories and none is 'unknown'.
TEST(InspectPyTorchForms, MemoryVizAlwaysFindsAnUnknownCategory) {
  auto categories = [](const nlohmann::json& trace) {
    std::set<std::string> out;
    for (const auto& e : trace)
      if (e.contains("category")) out.insert(e["category"].get<std::string>());
    return out;
  };
  // Every entry tagged: the trace ends with PyTorch's snapshot marker, untagged.
  auto device = make_emulated_device(0, EmulatedOptions{.capacity = std::size_t(64 * MiB)});
  AllocatorOptions options;
  options.trace_entries = 100;
  CachingAllocator alloc(*device, options);
  void* w = nullptr;
  {
    ScopedTag tag("weights");
    w = alloc.allocate(MiB);
  }
  const std::string path = temp_file("all_tagged.json", to_json(alloc.snapshot()));
  alloc.deallocate(w);
  const nlohmann::json trace = memory_viz_of(path, "all_tagged")["device_traces"][0];
  ASSERT_GE(trace.size(), 3u);
  EXPECT_EQ(categories(trace), (std::set<std::string>{"weights", "unknown"}));
  EXPECT_EQ(trace.back()["action"], "snapshot");
  EXPECT_EQ(trace.back()["category"], "unknown");
  EXPECT_EQ(trace.back()["frames"], nlohmann::json::array());
  EXPECT_EQ(trace[trace.size() - 2]["category"], "weights");
  // Read back, the marker is skipped: the same trace.
  EXPECT_EQ(load_snapshot(std::string(STOWAGE_BINARY_DIR) + "/tools_inspect_test_all_tagged.pickle").trace.size(),
            trace.size() - 1);
  // An untagged entry is 'unknown' itself: no marker.
  Snapshot s;
  s.trace.push_back({TraceAction::alloc, 0x1000, 512, Stream{}, 1000, "x"});
  s.trace.push_back({TraceAction::free_requested, 0x1000, 512, Stream{}, 2000, ""});
  s.trace.push_back({TraceAction::free_completed, 0x1000, 512, Stream{}, 3000, ""});
  const nlohmann::json mixed = memory_viz_of(temp_file("mixed_tags.json", to_json(s)), "mixed")["device_traces"][0];
  ASSERT_EQ(mixed.size(), 3u);
  EXPECT_EQ(categories(mixed), (std::set<std::string>{"x", "unknown"}));
}

// memory_viz's unpickler turns a LONG1 of more than 8 bytes into a BigInt, and mixing BigInt with
// numbers throws: integers are written as Python's pickle writes them (protocol 2). Expected
// bytes from /usr/bin/python3: pickle.dumps(v, protocol=2)[2:-1].hex().
TEST(InspectPyTorchForms, IntegersAreWrittenAsPythonWritesThem) {
  const std::pair<nlohmann::json, const char*> cases[] = {
      {0, "4b00"},
      {1, "4b01"},
      {255, "4bff"},
      {256, "4d0001"},
      {65535, "4dffff"},
      {65536, "4a00000100"},
      {2147483647, "4affffff7f"},
      {2147483648LL, "8a050000008000"},
      {4294967295LL, "8a05ffffffff00"},
      {4294967296LL, "8a050000000001"},
      {1099511627776LL, "8a06000000000001"},
      {140737488355328LL, "8a0700000000008000"},
      {36028797018963968LL, "8a080000000000008000"},
      {72057594037927935LL, "8a08ffffffffffffff00"},
      {9223372036854775807LL, "8a08ffffffffffffff7f"},
      {9223372036854775808ULL, "8a09000000000000008000"},
      {18446744073709551615ULL, "8a09ffffffffffffffff00"},
      {-1, "4affffffff"},
      {-128, "4a80ffffff"},
      {-129, "4a7fffffff"},
      {-256, "4a00ffffff"},
      {-32768, "4a0080ffff"},
      {-2147483648LL, "4a00000080"},
      {-2147483649LL, "8a05ffffff7fff"},
      {-4294967296LL, "8a0500000000ff"},
      {INT64_MIN, "8a080000000000000080"},
      // Unsigned JSON values that fit take the same opcodes.
      {nlohmann::json(std::uint64_t{200}), "4bc8"},
      {nlohmann::json(std::uint64_t{4294967296}), "8a050000000001"},
  };
  for (const auto& [value, hex] : cases) {
    const std::string bytes = write_pickle(value);
    std::string got;
    for (std::size_t i = 2; i + 1 < bytes.size(); ++i)
      got += fmt::format("{:02x}", static_cast<unsigned char>(bytes[i]));
    EXPECT_EQ(got, hex) << value.dump();
    EXPECT_EQ(read_pickle(bytes, "x"), value) << value.dump();
  }
  // A 4 GiB segment: no LONG1 of 9 bytes in the export.
  const std::string out = std::string(STOWAGE_BINARY_DIR) + "/tools_inspect_test_4gib.pickle";
  ASSERT_EQ(run_cli("inspect " + data("pytorch_4gib_segment.pickle") + " --to-memory-viz " + out).exit_code, 0);
  const std::string bytes = slurp(out);
  EXPECT_EQ(bytes.find("\x8a\x09"), std::string::npos);
  EXPECT_NE(bytes.find(std::string("\x8a\x05\0\0\0\0\x01", 7)), std::string::npos);  // 4 GiB in 5 bytes
  EXPECT_EQ(read_pickle(bytes, out)["segments"][1]["total_size"], 4096 * MiB);
}

// PyTorch 2.0 and 1.13 keep an allocation's frames and requested size in the block's history
// (history[0]: real_size, frames), read as _memory_viz.py's _block_extra_legacy and
// MemoryViz.js's annotate_snapshot read them.
TEST(InspectPyTorchForms, BlockHistoryGivesTagAndRequestedSize) {
  const Snapshot s = load_snapshot(data("pytorch_v20_history.pickle"));
  ASSERT_EQ(s.segments.at(0).blocks.size(), 3u);
  const auto& blocks = s.segments[0].blocks;
  EXPECT_EQ(blocks[0].tag, "forward (/work/train.py:42)");
  EXPECT_EQ(blocks[0].requested_size, 100u);
  EXPECT_EQ(blocks[1].tag, "backward (/work/train.py:50)");
  EXPECT_EQ(blocks[1].requested_size, 0u);  // free: its history is an earlier allocation's
  EXPECT_EQ(blocks[1].address, blocks[0].address + 512);
  EXPECT_EQ(s.stats.requested_bytes.all.current, 100);
  const SnapshotAnalysis a = analyze(s);
  ASSERT_EQ(a.tags_now.size(), 1u);
  EXPECT_EQ(a.tags_now[0].tag, "forward (/work/train.py:42)");
  EXPECT_EQ(a.largest_blocks.at(0).requested, 100);
  // torch.cuda.memory_snapshot() of 1.13: the bare list of segments, the same blocks.
  const nlohmann::json bare = read_pytorch_pickle(slurp(data("pytorch_v20_history.pickle")), "x")["segments"];
  const Snapshot b = snapshot_from_pytorch(bare, "x");
  EXPECT_EQ(b.segments.at(0).blocks.at(0).tag, "forward (/work/train.py:42)");
  EXPECT_EQ(b.segments[0].blocks[0].requested_size, 100u);
}

// PyTorch up to about 2.1 writes no time_us: the timeline's x axis is the event index.
TEST(InspectPyTorchForms, ATraceWithoutTimesIsDrawnByEvent) {
  const nlohmann::json j = inspect_json(data("pytorch_no_time.pickle"));
  EXPECT_EQ(j["trace_timed"], false);
  EXPECT_EQ(column(j["timeline"], "events"), (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(inspect_json(data("pytorch_snapshot.pickle"))["trace_timed"], true);
  const std::string svg_path = temp_file("no_time.svg", "");
  ASSERT_EQ(run_cli("inspect " + data("pytorch_no_time.pickle") + " --svg " + svg_path).exit_code, 0);
  const std::string svg = slurp(svg_path);
  EXPECT_NE(svg.find("trace event (the snapshot records no times)"), std::string::npos);
  // The allocated line: six points at six x positions.
  const auto begin = svg.find("points=\"") + 8;
  std::set<std::string> xs;
  for (std::size_t p = begin; p < svg.find('"', begin); p = svg.find(' ', p) + 1)
    xs.insert(svg.substr(p, svg.find(',', p) - p));
  EXPECT_EQ(xs.size(), 6u) << svg;
}

// A snapshot of several GPUs: one is analysed (--device, else the lowest), the others named;
// --to-memory-viz keeps them all.
TEST(InspectPyTorchForms, SeveralDevicesAreNamedAndSelectable) {
  const std::string file = data("pytorch_multi_device.pickle");
  auto r = run_cli("inspect " + file);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.substr(0, r.output.find('\n')), "device cuda:0 (PyTorch snapshot) (capacity unknown)");
  EXPECT_NE(r.output.find(", 0 OOMs\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  note: the file also holds cuda:1, cuda:2 (select one with --device N)\n"),
            std::string::npos)
      << r.output;
  r = run_cli("inspect --device 1 " + file);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.substr(0, r.output.find('\n')), "device cuda:1 (PyTorch snapshot) (capacity unknown)");
  EXPECT_NE(r.output.find(", 1 OOMs\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  note: the file also holds cuda:0, cuda:2 (select one with --device N)\n"),
            std::string::npos)
      << r.output;
  const nlohmann::json j = inspect_json("--device 2 " + file);
  EXPECT_EQ(j["device_name"], "cuda:2 (PyTorch snapshot)");
  EXPECT_EQ(j["reserved"], 2 * MiB);
  EXPECT_EQ(j["devices"], nlohmann::json::parse("[0, 1, 2]"));
  r = run_cli("inspect --device 3 " + file);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "stowage: inspect --device 3: " + file + " holds cuda:0, cuda:1, cuda:2\n");
  // Every device's segments and trace in the export, read back the same.
  const nlohmann::json viz = memory_viz_of(file, "multi");
  std::vector<std::int64_t> seg_devices;
  for (const auto& seg : viz["segments"]) seg_devices.push_back(seg["device"]);
  EXPECT_EQ(seg_devices, (std::vector<std::int64_t>{0, 1, 2}));
  ASSERT_EQ(viz["device_traces"].size(), 3u);
  std::vector<std::vector<std::string>> actions;
  for (const auto& t : viz["device_traces"]) {
    actions.emplace_back();
    for (const auto& e : t) actions.back().push_back(e["action"]);
  }
  EXPECT_EQ(actions, (std::vector<std::vector<std::string>>{
                         {"segment_alloc", "alloc", "snapshot"}, {"segment_alloc", "alloc", "oom", "snapshot"}, {}}));
  r = run_cli("inspect --json --device 1 " + std::string(STOWAGE_BINARY_DIR) + "/tools_inspect_test_multi.pickle");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["num_ooms"], 1);
}
