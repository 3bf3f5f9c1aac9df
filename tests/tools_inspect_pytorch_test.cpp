// `stowage inspect` on PyTorch's memory snapshots (torch.cuda.memory._snapshot()): its pickle as
// PyTorch 2.x writes it and its JSON, what the reader refuses, and the export for memory_viz
// (--to-memory-viz) read back by inspect and by Python's pickle.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/error.hpp"
#include "tools/inspect/inspect_report.hpp"
#include "tools/inspect/pickle_reader.hpp"
#include "tools/inspect/pytorch_export.hpp"
#include "tools/inspect/pytorch_snapshot.hpp"
#include "tools_inspect_test_util.hpp"

using namespace stowage;
using namespace stowage::inspect;
using namespace stowage::testing;

TEST(InspectPyTorch, ReadsItsPickleBothProtocolsAndItsJson) {
  // tests/data/make_pytorch_snapshot.py wrote the same dict three ways.
  std::string first;
  for (const char* name : {"pytorch_snapshot.pickle", "pytorch_snapshot_p2.pickle", "pytorch_snapshot.json"}) {
    const Snapshot s = load_snapshot(data(name));
    ASSERT_EQ(s.segments.size(), 2u) << name;
    ASSERT_EQ(s.trace.size(), 9u) << name;  // the "snapshot" marker is not a memory change
    const SnapshotAnalysis a = analyze(s);
    EXPECT_EQ(a.allocated, 16 * MiB) << name;
    EXPECT_EQ(a.reserved, 22 * MiB) << name;
    EXPECT_EQ(s.segments[0].blocks[0].tag, "init_weights (/work/train.py:12)") << name;
    EXPECT_EQ(s.segments[1].blocks[0].state, BlockState::active_pending_free) << name;
    EXPECT_EQ(s.segments[1].pool, Pool::small) << name;
    EXPECT_EQ(s.trace[0].action, TraceAction::segment_map) << name;
    EXPECT_EQ(s.trace[1].time_ns, 1'700'000'000'000'010'000) << name;
    EXPECT_EQ(s.trace.back().action, TraceAction::free_requested) << name;
    // The trace's peak: 8 MiB of weights and a 12 MiB activation. The 512 B block awaiting its
    // free stopped counting at its free_requested, as in PyTorch's allocated_bytes.
    EXPECT_EQ(a.trace_peak_allocated, 20 * MiB) << name;
    const std::string text = to_json(a).dump();
    if (first.empty()) first = text;
    EXPECT_EQ(text, first) << name << " reads differently";
  }
  auto r = run_cli("inspect " + data("pytorch_snapshot.pickle"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("attention (/work/train.py:77)"), std::string::npos) << r.output;
}

// PyTorch's snapshot holds no device capacity (its segments add up to reserved, not to the
// device): the summary says the capacity is unknown; stowage's own snapshots keep theirs.
TEST(InspectPyTorch, CapacityIsUnknownNotReserved) {
  auto r = run_cli("inspect " + data("pytorch_snapshot.pickle"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.substr(0, r.output.find('\n')), "device cuda:0 (PyTorch snapshot) (capacity unknown)");
  r = run_cli("inspect --json " + data("pytorch_snapshot.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(j.at("capacity").is_null()) << j.at("capacity");
  EXPECT_EQ(j.at("reserved"), 22 * MiB);
  r = run_cli("inspect " + data("inspect_snapshot_a.json"));
  EXPECT_EQ(r.output.substr(0, r.output.find('\n')), "device emulated (capacity 64.00 MiB)");
  EXPECT_EQ(nlohmann::json::parse(run_cli("inspect --json " + data("inspect_snapshot_a.json")).output)["capacity"],
            64 * MiB);
}

TEST(InspectPyTorch, ExportsForMemoryVizWithTagsAndReadsItBack) {
  auto device = make_emulated_device(0, EmulatedOptions{.capacity = std::size_t(64 * MiB)});
  AllocatorOptions options;
  options.trace_entries = 1000;
  CachingAllocator alloc(*device, options);
  void* w = nullptr;
  {
    ScopedTag tag("weights");
    w = alloc.allocate(6 * MiB);
  }
  {
    ScopedTag tag("activations");
    alloc.deallocate(alloc.allocate(3 * MiB + 5));
  }
  const Snapshot original = alloc.snapshot();
  const std::string path = temp_file("export_source.json", to_json(original));
  const std::string out = std::string(STOWAGE_BINARY_DIR) + "/tools_inspect_test_export.pickle";
  auto r = run_cli("inspect " + path + " --to-memory-viz " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Snapshot back = load_snapshot(out);
  ASSERT_EQ(back.segments.size(), original.segments.size());
  for (std::size_t i = 0; i < back.segments.size(); ++i) {
    ASSERT_EQ(back.segments[i].blocks.size(), original.segments[i].blocks.size());
    for (std::size_t k = 0; k < back.segments[i].blocks.size(); ++k) {
      const BlockInfo &x = back.segments[i].blocks[k], &y = original.segments[i].blocks[k];
      EXPECT_EQ(x.address, y.address);
      EXPECT_EQ(x.size, y.size);
      EXPECT_EQ(x.requested_size, y.requested_size);
      EXPECT_EQ(x.state, y.state);
      EXPECT_EQ(x.tag, y.tag);
    }
  }
  ASSERT_EQ(back.trace.size(), original.trace.size());
  for (std::size_t i = 0; i < back.trace.size(); ++i) {
    EXPECT_EQ(back.trace[i].action, original.trace[i].action);
    EXPECT_EQ(back.trace[i].address, original.trace[i].address);
    EXPECT_EQ(back.trace[i].size, original.trace[i].size);
    EXPECT_EQ(back.trace[i].tag, original.trace[i].tag);
    EXPECT_EQ(back.trace[i].time_ns, original.trace[i].time_ns / 1000 * 1000);  // microseconds
  }
  EXPECT_EQ(analyze(back).allocated, 6 * MiB);
  // Python's own pickle reads it, with the tags where memory_viz shows them.
  if (std::system("test -x /usr/bin/python3") != 0) GTEST_SKIP() << "no /usr/bin/python3";
  const std::string check = temp_file("check_export.py",
                                      "import pickle, sys\n"
                                      "s = pickle.load(open(sys.argv[1], 'rb'))\n"
                                      "tags = sorted({f['name'] for e in s['device_traces'][0] for f in e['frames']})\n"
                                      "print(len(s['segments']), len(s['device_traces'][0]), ','.join(tags))\n");
  FILE* p = popen(("/usr/bin/python3 " + check + " " + out).c_str(), "r");
  ASSERT_NE(p, nullptr);
  char line[512] = {};
  ASSERT_NE(std::fgets(line, sizeof line, p), nullptr);
  EXPECT_EQ(pclose(p), 0);
  // Every entry is tagged: the trace ends with PyTorch's snapshot marker (memory_viz's 'unknown').
  EXPECT_EQ(std::string(line),
            fmt::format("{} {} activations,weights\n", original.segments.size(), original.trace.size() + 1));
  alloc.deallocate(w);
}

TEST(InspectPyTorch, FramesOfWrongTypesOnlyLoseTheirLabel) {
  // Frames only label a block: a name, file or line of another type reads as absent ("?"),
  // never as an exception that escapes the reader (found by pytorch_pickle_fuzz).
  const nlohmann::json j = nlohmann::json::parse(R"({"segments": [{"device": 0, "address": 4096, "total_size": 2048,
    "blocks": [{"size": 1024, "state": "active_allocated", "frames": [{"name": 7, "filename": ["x"], "line": "12"}]},
               {"size": 1024, "state": "active_allocated", "frames": [{"name": "fwd", "filename": "m.py", "line": 3}]}]}],
    "device_traces": [[]]})");
  const Snapshot s = snapshot_from_pytorch(j, "x");
  ASSERT_EQ(s.segments.at(0).blocks.size(), 2u);
  EXPECT_EQ(s.segments[0].blocks[0].tag, "? (?:?)");
  EXPECT_EQ(s.segments[0].blocks[1].tag, "fwd (m.py:3)");
  EXPECT_EQ(analyze(s).allocated, 2048u);
}

TEST(InspectPyTorch, RefusesWhatAMemorySnapshotDoesNotHold) {
  auto refused = [](const std::string& bytes, const std::string& needle) {
    try {
      read_pickle(bytes, "x");
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const ParseError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused(std::string("\x80\x02"
                      "cos\nsystem\n",
                      13),
          "GLOBAL (0x63) is not read");
  refused(std::string("\x80\x02"
                      "cos\nsystem\n",
                      13),
          "at byte 2");
  refused(std::string("\x80\x02X\xff\x00\x00\x00"
                      "ab",
                      10),
          "truncated");
  refused(std::string("\x80\x02]", 3), "ends before STOP");
  refused(std::string("\x80\x01N.", 4), "protocol 1");
  refused(std::string("\x80\x02]q\x00h\x00"
                      "a.",
                      9),
          "contains itself");  // a list inside itself
  std::string deep = "\x80\x02";
  for (int i = 0; i < 100; ++i) deep += ']';
  for (int i = 0; i < 99; ++i) deep += 'a';
  refused(deep + ".", "deeper than 64");
  // Forty levels of [x, x] through the memo: 2^40 values if expanded.
  std::string wide = "\x80\x02]q";
  wide.push_back('\0');
  for (int i = 1; i <= 40; ++i) {
    wide += "0](h";  // drop the level below from the stack (the memo keeps it)
    wide.push_back(char(i - 1));
    wide += 'h';
    wide.push_back(char(i - 1));
    wide += "eq";
    wide.push_back(char(i));
  }
  refused(wide + ".", "expands beyond");
  // What it reads: the round trip of a value with every kind the writer makes.
  const nlohmann::json v = {{"a", {1, -2, 3000000000LL, -5000000000LL, 18446744073709551615ULL}},
                            {"b", {{"c", 1.5}, {"d", nullptr}, {"e", true}, {"f", false}}},
                            {"g", "text ü"},
                            {"h", nlohmann::json::array()},
                            {"i", nlohmann::json::object()}};
  EXPECT_EQ(read_pickle(write_pickle(v), "round trip"), v);
}

TEST(InspectPyTorch, OomEntriesCarryDeviceFreeBothWays) {
  // PyTorch writes an OOM's device_free where other entries have addr (Module.cpp).
  const Snapshot s = load_snapshot(data("pytorch_oom.pickle"));
  ASSERT_EQ(s.trace.size(), 3u);
  EXPECT_EQ(s.trace[2].action, TraceAction::oom);
  EXPECT_EQ(s.trace[2].address, 123456789u);
  EXPECT_EQ(s.trace[2].size, std::size_t(16 * MiB));
  EXPECT_EQ(s.stats.num_ooms, 1);
  EXPECT_EQ(analyze(s).num_ooms, 1);
  // memory_viz (and _memory_viz.trace()) read e['device_free'] for an OOM.
  const nlohmann::json viz = to_pytorch(s);
  const nlohmann::json& oom = viz["device_traces"][0][2];
  EXPECT_EQ(oom["action"], "oom");
  EXPECT_EQ(oom["device_free"], 123456789);
  EXPECT_FALSE(oom.contains("addr"));
  EXPECT_EQ(snapshot_from_pytorch(viz, "round trip").trace[2].address, 123456789u);
}

// torch.cuda.memory_snapshot() returns the bare list of segments; saved as JSON it reads as its
// pickle does, and a malformed one is refused naming the file and the entry once (it was handed
// to stowage's own reader: "snapshot: snapshot: expected an object").
TEST(InspectPyTorch, ABareJsonListOfSegmentsReadsAsItsPickle) {
  const nlohmann::json segments = nlohmann::json::parse(
      R"([{"device": 0, "address": 4096, "total_size": 2048, "stream": 0, "segment_type": "large",
           "blocks": [{"size": 1024, "state": "active_allocated"}, {"size": 1024, "state": "inactive"}]}])");
  const Snapshot s = load_snapshot(temp_file("segments_only.json", segments.dump()));
  ASSERT_EQ(s.segments.size(), 1u);
  EXPECT_EQ(analyze(s).allocated, 1024);
  EXPECT_EQ(to_json(analyze(s)),
            to_json(analyze(load_snapshot(temp_file("segments_only.pickle", write_pickle(segments))))));
  for (const auto& [text, message] :
       {std::pair<std::string, std::string>{"[1]", ".segments[0]: expected a dict"},
        {" [{\"address\": 4096}]", ".segments[0]: field 'total_size' is missing"},
        {"[{\"address\": 4096, \"total_size\": 1024, \"blocks\": 3}]", ".segments[0].blocks: expected a list"}}) {
    const std::string path = temp_file("bad_segments.json", text);
    const auto r = run_cli("inspect " + path);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(r.output, "stowage: " + path + message + "\n") << text;
  }
}

namespace {

// A PyTorch-shaped pickle with `entries` trace entries that all share one frames list of
// `depth` frames through the memo, as PyTorch's do with stacks="all": the C++ frames first,
// the Python frame "forward (/m/model.py:7)" at depth - 2. Allocations of 1000 bytes at
// alternating addresses, each freed (requested, completed) before the next.
std::string shared_frames_pickle(int entries, int depth) {
  std::string p = "\x80\x02";
  auto put_le = [&](std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) p.push_back(static_cast<char>(v >> (8 * i) & 0xff));
  };
  auto str = [&](const std::string& text) {
    p.push_back('X');
    put_le(text.size(), 4);
    p += text;
  };
  auto integer = [&](std::int64_t v) {
    p += "\x8a\x08";
    put_le(static_cast<std::uint64_t>(v), 8);
  };
  p += "}(";
  str("segments");
  p += "]";
  str("device_traces");
  p += "]](";
  const char* actions[] = {"alloc", "free_requested", "free_completed"};
  for (int i = 0; i < entries; ++i) {
    p += "}(";
    str("action");
    str(actions[i % 3]);
    str("addr");
    integer(0x7f0000000000 + (i / 3 % 2) * 4096);
    str("size");
    integer(1000);
    str("time_us");
    integer(i);
    str("frames");
    if (i == 0) {
      p += "]r";  // LONG_BINPUT 0: the shared list
      put_le(0, 4);
      p += "(";
      for (int f = 0; f < depth; ++f) {
        const bool py = f == depth - 2;
        p += "}(";
        str("filename");
        str(py       ? "/m/model.py"
            : f == 0 ? "/pytorch/torch/csrc/profiler/unwind/unwind.cpp"
                     : "/pytorch/aten/src/ATen/core/boxing/k.h");
        str("line");
        integer(py ? 7 : f);
        str("name");
        str(py ? "forward" : f == 0 ? "torch::unwind::unwind()" : "c10::impl::call");
        p += "u";
      }
      p += "e";
    } else {
      p += "j";  // LONG_BINGET 0
      put_le(0, 4);
    }
    p += "u";
  }
  p += "eau.";
  return p;
}

}  // namespace

TEST(InspectPyTorch, SharedFramesListsAreReducedBeforeTheyAreCopied) {
  // 20,000 entries sharing a 256-frame stack: 20,000 x 1,025 = 20.5 million values if every
  // reference were expanded, beyond kMaxPickleValues (2^24), as PyTorch's tutorial settings
  // (stacks="all", max_entries=100000) were. The "frames" selector keeps one frame per distinct
  // stack before anything is copied, and the budget counts only what is kept.
  static_assert(20000 * 1025 > kMaxPickleValues);
  const std::string bytes = shared_frames_pickle(20000, 256);
  const nlohmann::json j = read_pytorch_pickle(bytes, "x");
  const nlohmann::json& trace = j["device_traces"][0];
  ASSERT_EQ(trace.size(), 20000u);
  ASSERT_EQ(trace[19999]["frames"].size(), 1u);
  EXPECT_EQ(trace[19999]["frames"][0]["name"], "forward");
  const Snapshot s = load_snapshot(temp_file("shared_frames.pickle", bytes));
  ASSERT_EQ(s.trace.size(), 20000u);
  EXPECT_EQ(s.trace[0].tag, "forward (/m/model.py:7)");
  EXPECT_EQ(s.trace[0].size, 1024u);  // 1000 requested, rounded as the allocator does
  EXPECT_EQ(analyze(s).trace_peak_allocated, 1024);
  // A selector sees each distinct list once; what it keeps reads like the list in full.
  const std::string small = shared_frames_pickle(50, 8);
  int calls = 0;
  const ListSelector all{"frames", [&](std::size_t n, const auto& item) {
                           ++calls;
                           EXPECT_EQ(item(n - 2)["name"], "forward");
                           std::vector<std::size_t> keep(n);
                           for (std::size_t i = 0; i < n; ++i) keep[i] = i;
                           return keep;
                         }};
  EXPECT_EQ(read_pickle(small, "x", &all), read_pickle(small, "x"));
  EXPECT_EQ(calls, 1);
  const ListSelector none{"frames", [](std::size_t, const auto&) { return std::vector<std::size_t>{}; }};
  EXPECT_EQ(read_pickle(small, "x", &none)["device_traces"][0][5]["frames"], nlohmann::json::array());
  const ListSelector wrong{"frames", [](std::size_t n, const auto&) { return std::vector<std::size_t>{n}; }};
  EXPECT_THROW(read_pickle(small, "x", &wrong), ParseError);
}

TEST(InspectPyTorch, TagsSkipTheFramesMemoryVizHides) {
  // stacks="all": the innermost frame is always the unwinder. The tag is the first Python frame
  // PyTorch's _frame_filter keeps, else the first frame it keeps, else the innermost.
  const Snapshot s = load_snapshot(data("pytorch_stacks_all.pickle"));
  ASSERT_EQ(s.segments.at(0).blocks.size(), 4u);
  EXPECT_EQ(s.segments[0].blocks[0].tag, "forward (/work/model.py:40)");
  EXPECT_EQ(s.segments[0].blocks[1].tag,
            "at::native::empty_cuda (/pytorch/aten/src/ATen/native/cuda/EmptyTensor.cpp:23)");
  EXPECT_EQ(s.segments[0].blocks[2].tag,
            "torch::unwind::unwind() (/pytorch/torch/csrc/profiler/unwind/unwind.cpp:322)");
  ASSERT_EQ(s.trace.size(), 4u);
  EXPECT_EQ(s.trace[1].tag, "forward (/work/model.py:40)");
  // The same tags from the frames in full (PyTorch's JSON) as from the selected ones.
  const Snapshot full = snapshot_from_pytorch(read_pickle(slurp(data("pytorch_stacks_all.pickle")), "x"), "x");
  for (std::size_t k = 0; k < 4; ++k) EXPECT_EQ(full.segments[0].blocks[k].tag, s.segments[0].blocks[k].tag);
  // stowage's own tag frame still wins wherever it is.
  const nlohmann::json j = nlohmann::json::parse(R"({"segments": [{"address": 4096, "total_size": 1024,
    "blocks": [{"size": 1024, "state": "active_allocated", "frames": [{"name": "f", "filename": "a.py", "line": 1},
               {"name": "weights", "filename": "stowage tag", "line": 0}]}]}], "device_traces": [[]]})");
  EXPECT_EQ(snapshot_from_pytorch(j, "x").segments[0].blocks[0].tag, "weights");
}

TEST(InspectPyTorch, ABlockPendingFreeIsNoLongerAllocated) {
  // PyTorch's free() lowers allocated_bytes at free_requested; a block used on another stream
  // stays active_pending_free until free_completed. Sizes are blocks' (requests rounded to 512).
  const Snapshot s = load_snapshot(data("pytorch_streams.pickle"));
  const SnapshotAnalysis a = analyze(s);
  EXPECT_EQ(a.allocated, 2 * MiB);
  EXPECT_EQ(a.peak_allocated, 13631488);  // 4 MiB + 512, 6 MiB - 512 and 3 MiB
  EXPECT_EQ(a.trace_peak_allocated, 13631488);
  std::vector<std::int64_t> along;
  for (const auto& p : a.timeline) along.push_back(p.allocated);
  EXPECT_EQ(along, (std::vector<std::int64_t>{0, 0, 4194816, 10485760, 13631488, 9436672, 3145728, 3145728, 5242880,
                                              2097152, 2097152}));
  // tags now add up to allocated: the pending all_reduce block is not counted.
  ASSERT_EQ(a.tags_now.size(), 1u);
  EXPECT_EQ(a.tags_now[0].tag, "forward (/work/train.py:40)");
  EXPECT_EQ(a.tags_now[0].bytes, 2 * MiB);
  // The trace covers the whole run: no "(before trace)", every byte at the peak has its tag.
  std::int64_t at_peak = 0;
  for (const auto& t : a.tags_at_peak) {
    EXPECT_NE(t.tag, "(before trace)");
    at_peak += t.bytes;
  }
  EXPECT_EQ(at_peak, 13631488);
  EXPECT_EQ(s.trace[2].size, 6u * 1024 * 1024 - 512);  // 6 MiB - 1000 requested
}

TEST(InspectPyTorch, ClassicSegmentsAreAllocatedExpandableOnesMapped) {
  // memory_viz and _memory_viz.trace() know a classic segment by segment_alloc/segment_free.
  for (const SegmentMode mode : {SegmentMode::classic, SegmentMode::expandable}) {
    auto device = make_emulated_device(0, EmulatedOptions{.capacity = std::size_t(256 * MiB)});
    AllocatorOptions options;
    options.trace_entries = 1000;
    options.segments = mode;
    CachingAllocator alloc(*device, options);
    ASSERT_EQ(alloc.segment_mode(), mode);
    alloc.deallocate(alloc.allocate(30 * MiB));
    void* keep = alloc.allocate(MiB);
    alloc.empty_cache();
    const nlohmann::json viz = to_pytorch(alloc.snapshot());
    std::vector<std::string> actions;
    for (const auto& e : viz["device_traces"][0])
      if (e["action"].get<std::string>().starts_with("segment")) actions.push_back(e["action"]);
    const bool classic = mode == SegmentMode::classic;
    ASSERT_GE(actions.size(), 2u);
    for (const auto& a : actions)
      EXPECT_TRUE(classic ? a == "segment_alloc" || a == "segment_free" : a == "segment_map" || a == "segment_unmap")
          << a;
    EXPECT_NE(std::find(actions.begin(), actions.end(), classic ? "segment_free" : "segment_unmap"), actions.end());
    alloc.deallocate(keep);
  }
}

TEST(InspectPyTorch, MinorFormsAreNamed) {
  // Protocols 0 and 1 (no PROTO opcode) are named, not read as malformed JSON.
  for (const std::string& text :
       {std::string("(dp0\nVsegments\np1\n(lp2\nsS'device_traces'\np3\n(lp4\ns."), std::string("}q\0.", 4)}) {
    const std::string path = temp_file("old_protocol.pickle", text);
    try {
      load_snapshot(path);
      ADD_FAILURE() << "read " << text;
    } catch (const ParseError& e) {
      EXPECT_NE(std::string(e.what()).find("protocol 0 or 1, which is not supported"), std::string::npos) << e.what();
    }
  }
  // PyTorch writes integers: a float in an integer field is refused, by field and entry.
  auto refused = [](const std::string& json, const std::string& needle) {
    try {
      snapshot_from_pytorch(nlohmann::json::parse(json), "x");
      ADD_FAILURE() << "accepted " << json;
    } catch (const ParseError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused(R"({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1.5e14, "size": 512}]]})",
          "x.device_traces[0][0]: field 'addr' is 150000000000000.0, not an integer");
  refused(R"({"segments": [], "device_traces": [[{"action": "alloc", "addr": 4096, "size": 512,
             "time_us": 1.7e15}]]})",
          "x.device_traces[0][0]: field 'time_us' is");
  refused(R"({"segments": [{"address": 4096, "total_size": 1024.0, "blocks": []}], "device_traces": []})",
          "x.segments[0]: field 'total_size' is 1024.0, not an integer");
  refused(R"("segments")", "expected a dict with \"segments\" and \"device_traces\" (or a list of segments)");
  // A bare list of segments: an older form _memory_viz._read still takes.
  const nlohmann::json segments = nlohmann::json::parse(
      R"([{"device": 0, "address": 4096, "total_size": 2048, "stream": 0, "segment_type": "large",
           "blocks": [{"size": 1024, "state": "active_allocated"}, {"size": 1024, "state": "inactive"}]}])");
  const Snapshot s = load_snapshot(temp_file("segments_only.pickle", write_pickle(segments)));
  ASSERT_EQ(s.segments.size(), 1u);
  EXPECT_TRUE(s.trace.empty());
  EXPECT_EQ(analyze(s).allocated, 1024);
}
