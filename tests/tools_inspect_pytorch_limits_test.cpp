// `stowage inspect` on PyTorch snapshots at the edges of what it reads: OOM requests beyond any
// device, pickles whose memo multiplies strings and values, devices that hold only PyTorch's
// "snapshot" marks, and block sizes that differ from the rounded request. The hostile pickles
// are made here, at run time.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "stowage/error.hpp"
#include "tools/inspect/inspect_report.hpp"
#include "tools/inspect/pickle_reader.hpp"
#include "tools/inspect/pytorch_blocks.hpp"
#include "tools/inspect/pytorch_snapshot.hpp"
#include "tools_inspect_test_util.hpp"

using namespace stowage;
using namespace stowage::inspect;
using namespace stowage::testing;

namespace {

constexpr std::uint64_t kBase = 0x7f0000000000;

nlohmann::json entry(const char* action, std::uint64_t addr, std::uint64_t size, std::int64_t time_us = 0) {
  return {{"action", action}, {"addr", addr}, {"size", size}, {"stream", 0}, {"time_us", time_us}};
}

// A classic segment at `address` with blocks of (size, state), on `device`.
nlohmann::json segment(std::uint64_t address, const std::vector<std::pair<std::uint64_t, const char*>>& blocks,
                       int device = 0) {
  nlohmann::json b = nlohmann::json::array();
  std::uint64_t at = address, total = 0;
  for (const auto& [size, state] : blocks) {
    b.push_back({{"address", at}, {"size", size}, {"requested_size", size}, {"state", state}});
    at += size;
    total += size;
  }
  return {{"device", device}, {"address", address},      {"total_size", total},
          {"stream", 0},      {"segment_type", "large"}, {"blocks", b}};
}

std::string pickle_file(const std::string& name, const nlohmann::json& snapshot) {
  return temp_file(name + ".pickle", write_pickle(snapshot));
}

nlohmann::json inspect_json(const std::string& args) {
  const auto r = run_cli("inspect --json " + args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
}

std::string le32(std::uint64_t v) {
  std::string out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i) & 0xff));
  return out;
}
std::string str(const std::string& text) { return "X" + le32(text.size()) + text; }

// A list of `refs` references to one value (pickled as `item`) through the memo.
std::string memo_list(const std::string& item, std::size_t refs) {
  std::string p = "\x80\x02](" + item + "r" + le32(0);
  for (std::size_t i = 1; i < refs; ++i) p += "j" + le32(0);
  return p + "e.";
}

bool sanitized() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#elif defined(__has_feature)
  return __has_feature(address_sanitizer) || __has_feature(thread_sanitizer);
#else
  return false;
#endif
}

// `stowage inspect FILE` with its address space limited to `kib` KiB.
CommandResult run_limited(const std::string& file, long kib) {
  return stowage::testing::run_shell("ulimit -v " + std::to_string(kib) + " && '" + std::string(STOWAGE_CLI) +
                                     "' inspect '" + file + "' 2>&1");
}

}  // namespace

// torch.empty(2**47, dtype=torch.float32) on a GPU records an OOM of 512 TiB (a real 2.11
// snapshot): the request is reported, not summed, so no size that fits 64 bits refuses the file.
TEST(InspectPyTorchLimits, AnOomRequestBeyondAnyDeviceIsReportedNotRefused) {
  auto snapshot = [](std::uint64_t oom, std::uint64_t alloc) {
    nlohmann::json oom_entry = {
        {"action", "oom"}, {"device_free", 70ULL << 30}, {"size", oom}, {"stream", 0}, {"time_us", 3}};
    return nlohmann::json{
        {"segments", {segment(kBase, {{8 * MiB, "active_allocated"}, {12 * MiB, "inactive"}})}},
        {"device_traces", {{entry("segment_alloc", kBase, 20 * MiB, 1), entry("alloc", kBase, alloc, 2), oom_entry}}}};
  };
  const std::string file = pickle_file("oom_2p49", snapshot(1ULL << 49, 8 * MiB));
  auto r = run_cli("inspect " + file);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(", 1 OOMs\n  OOM: asked for 512.00 TiB (70.00 GiB free on the device)\n"), std::string::npos)
      << r.output;
  nlohmann::json j = inspect_json(file);
  EXPECT_EQ(j["num_ooms"], 1);
  EXPECT_EQ(j["ooms"], nlohmann::json::parse(R"([{"time_ns": 3000, "events": 3, "requested": 562949953421312,
                                                  "device_free": 75161927680, "tag": ""}])"));
  EXPECT_EQ(j["peak_allocated"], 8 * MiB);
  EXPECT_EQ(j["peak_reserved"], 20 * MiB);
  // Written for memory_viz and read back, the request is kept.
  const std::string out = std::string(STOWAGE_BINARY_DIR) + "/tools_inspect_test_oom_2p49_viz.pickle";
  ASSERT_EQ(run_cli("inspect " + file + " --to-memory-viz " + out).exit_code, 0);
  EXPECT_EQ(read_pickle(slurp(out), out)["device_traces"][0][2]["size"], 1ULL << 49);
  EXPECT_EQ(inspect_json(out)["ooms"][0]["requested"], 1ULL << 49);
  // The largest size_t PyTorch can write.
  j = inspect_json(pickle_file("oom_max", snapshot(UINT64_MAX, 8 * MiB)));
  EXPECT_EQ(j["ooms"][0]["requested"], UINT64_MAX);
  // A size that is summed keeps the limit.
  const std::string huge_alloc = pickle_file("alloc_2p49", snapshot(MiB, 1ULL << 49));
  r = run_cli("inspect " + huge_alloc);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "stowage: " + huge_alloc +
                          ".device_traces[0][1]: field 'size' is 562949953421312 bytes, more than 256 TiB\n");
}

TEST(InspectPyTorchLimits, TheBudgetGrowsWithTheFile) {
  EXPECT_EQ(pickle_budget(0).values, std::size_t{1} << 20);
  EXPECT_EQ(pickle_budget(0).text, std::size_t{64} << 20);
  EXPECT_EQ(pickle_budget(std::size_t{1} << 20).values, std::size_t{2} << 20);
  EXPECT_EQ(pickle_budget(std::size_t{1} << 20).text, std::size_t{80} << 20);
  EXPECT_EQ(pickle_budget(std::size_t{64} << 20).values, kMaxPickleValues);
  EXPECT_EQ(pickle_budget(std::size_t{64} << 20).text, std::size_t{64 + 1024} << 20);
}

// One 1 MiB string referenced through the memo: each reference is a copy, so each counts its
// bytes; the result reads up to the text budget exactly, and one reference more is refused.
TEST(InspectPyTorchLimits, EveryReferenceToAStringCountsItsBytes) {
  const std::string mib(MiB, 'x');
  const std::size_t head = memo_list(str(mib), 1).size() - 5;  // and 5 bytes a reference
  auto fits = [&](std::size_t refs) { return refs * mib.size() <= pickle_budget(head + 5 * refs).text; };
  std::size_t refs = 1;
  while (fits(refs + 1)) ++refs;
  EXPECT_EQ(refs, 80u);  // 64 MiB and 16 bytes for each of the file's 1 MiB and some
  const std::string ok = memo_list(str(mib), refs);
  const nlohmann::json j = read_pickle(ok, "x");
  ASSERT_EQ(j.size(), refs);
  EXPECT_EQ(j.back(), mib);
  const std::string over = memo_list(str(mib), refs + 1);
  try {
    read_pickle(over, "x");
    ADD_FAILURE() << "read";
  } catch (const ParseError& e) {
    EXPECT_EQ(std::string(e.what()),
              fmt::format("x: pickle: strings that expand beyond the reader's limit ({} bytes of text for a file of "
                          "{} bytes; each reference to a string counts) at byte {}",
                          pickle_budget(over.size()).text, over.size(), over.size()));
  }
  // As a dict key in 6,000 dicts: the key is not copied while reading, and counts when expanded.
  std::string keys = "\x80\x02](}" + str(mib) + "r" + le32(0) + "Ns";
  for (int i = 1; i < 6000; ++i) keys += "}j" + le32(0) + "Ns";
  EXPECT_THROW(read_pickle(keys + "e.", "x"), ParseError);
}

// A memoized dict of eight items referenced again and again: each reference counts its nine
// values, up to the value budget exactly.
TEST(InspectPyTorchLimits, EveryReferenceToADictCountsItsValues) {
  std::string dict = "}(";
  for (int i = 0; i < 8; ++i) dict += str(fmt::format("k{}", i)) + "K" + std::string(1, char(i));
  dict += "u";
  const std::size_t head = memo_list(dict, 1).size() - 5;  // and 5 bytes a reference
  auto fits = [&](std::size_t refs) { return 1 + 9 * refs <= pickle_budget(head + 5 * refs).values; };
  std::size_t refs = 1;
  while (fits(refs + 1)) ++refs;
  EXPECT_EQ(refs, 262164u);  // (2^20 + the file's 1.3 million bytes) / 9
  EXPECT_EQ(read_pickle(memo_list(dict, refs), "x").size(), refs);
  try {
    read_pickle(memo_list(dict, refs + 1), "x");
    ADD_FAILURE() << "read";
  } catch (const ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("a value that expands beyond the reader's limit ("), std::string::npos)
        << e.what();
  }
}

// What a hostile pickle can make the reader hold is bounded as it reads, not only when it
// expands: the stack, the MARKs, the memo.
TEST(InspectPyTorchLimits, ReadingIsBoundedBeforeExpanding) {
  auto refused = [](const std::string& bytes, const std::string& message) {
    try {
      read_pickle(bytes, "x");
      ADD_FAILURE() << "read: " << message;
    } catch (const ParseError& e) {
      EXPECT_EQ(std::string(e.what()), "x: pickle: " + message);
    }
  };
  const std::size_t n = kMaxPickleValues;
  refused("\x80\x02" + std::string(n, 'N') + ".",
          fmt::format("STOP with {} values on the stack (one expected) at byte {}", n, n + 3));
  refused("\x80\x02" + std::string(n + 1, 'N') + ".",
          fmt::format("more values on the stack than the reader's limit ({}) at byte {}", n, n + 3));
  refused("\x80\x02" + std::string(n + 1, '(') + ".",
          fmt::format("more MARKs than the reader's limit ({}) at byte {}", n, n + 3));
  refused("\x80\x02Nr" + le32(n) + ".", fmt::format("memo {} is beyond the reader's limit ({}) at byte 8", n, n));
  refused("\x80\x02Nr" + le32(5) + "j" + le32(4) + ".", "memo 4 was never stored at byte 13");
}

// The review's reproducers, as a user runs them, under a 1 GB address space: a 1 MiB pickle
// whose memo hands one 1 MiB string out 6,000 times (6 GB expanded), and 16 MiB of None.
TEST(InspectPyTorchLimits, HostilePicklesEndInAParseErrorWithinTheirMemory) {
  if (sanitized()) GTEST_SKIP() << "a sanitizer reserves more address space than the limit";
  std::string bomb = "\x80\x02}(" + str("segments") + "]" + str("device_traces") + "]" + str("external_annotations") +
                     "](" + str(std::string(MiB, 'x')) + "r" + le32(0);
  for (int i = 1; i < 6000; ++i) bomb += "j" + le32(0);
  bomb += "eu.";
  const std::string file = temp_file("string_bomb.pickle", bomb);
  auto r = run_limited(file, 1 << 20);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("pickle: strings that expand beyond the reader's limit ("), std::string::npos) << r.output;
  const std::string nones = temp_file("none_flood.pickle", "\x80\x04" + std::string(kMaxPickleValues, 'N') + ".");
  r = run_limited(nones, 1 << 20);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("pickle: STOP with 16777216 values on the stack"), std::string::npos) << r.output;
}

// One process on cuda:3 of eight: from its second snapshot on, PyTorch has written a "snapshot"
// mark into every device's trace. Those devices hold no memory: skipped, and said so.
TEST(InspectPyTorchLimits, DevicesWithOnlySnapshotMarksAreSkipped) {
  const nlohmann::json mark = entry("snapshot", 0, 0, 9);
  nlohmann::json traces = nlohmann::json::array();
  for (int d = 0; d < 8; ++d) traces.push_back({mark});
  traces[5] = {entry("a_later_kind", 0, 0, 9)};  // what a later PyTorch adds reads the same
  traces[3] = {entry("segment_alloc", kBase, 20 * MiB, 1), entry("alloc", kBase, 12 * MiB, 2), mark};
  nlohmann::json snapshot = {{"segments", {segment(kBase, {{12 * MiB, "active_allocated"}, {8 * MiB, "inactive"}}, 3)}},
                             {"device_traces", traces}};
  const std::string file = pickle_file("rank3", snapshot);
  auto r = run_cli("inspect " + file);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.substr(0, r.output.find("  allocated")),
            "device cuda:3 (PyTorch snapshot) (capacity unknown)\n"
            "  note: cuda:0, cuda:1, cuda:2, cuda:4, cuda:5, cuda:6, cuda:7 skipped: no segments, and no trace entry "
            "that changes memory (PyTorch marks each snapshot in every device's trace)\n");
  const nlohmann::json j = inspect_json(file);
  EXPECT_EQ(j["devices"], nlohmann::json::parse("[3]"));
  EXPECT_EQ(j["skipped_devices"], nlohmann::json::parse("[0, 1, 2, 4, 5, 6, 7]"));
  EXPECT_EQ(j["allocated"], 12 * MiB);
  EXPECT_EQ(j["peak_allocated"], 12 * MiB);
  r = run_cli("inspect --device 0 " + file);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "stowage: inspect --device 0: " + file +
                          " holds cuda:3; cuda:0, cuda:1, cuda:2, cuda:4, cuda:5, cuda:6, cuda:7 skipped: no segments, "
                          "and no trace entry that changes memory (PyTorch marks each snapshot in every device's "
                          "trace)\n");
  // An entry the reader refuses keeps its device, and is reported.
  snapshot["device_traces"][7] = {mark, 7};
  const std::string broken = pickle_file("rank3_broken", snapshot);
  r = run_cli("inspect " + broken);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "stowage: " + broken + ".device_traces[7][1]: expected a JSON object\n");
  // No device holds memory: the lowest stands for the file, the others are skipped.
  snapshot = {{"segments", nlohmann::json::array()}, {"device_traces", {{mark}, {mark}, {mark}}}};
  const nlohmann::json none = inspect_json(pickle_file("marks_only", snapshot));
  EXPECT_EQ(none["device_name"], "cuda:0 (PyTorch snapshot)");
  EXPECT_EQ(none["skipped_devices"], nlohmann::json::parse("[1, 2]"));
}

// CUDACachingAllocator.cpp round_size, roundup_power2_divisions included.
TEST(InspectPyTorchLimits, RequestsRoundAsPyTorchRoundsThem) {
  PyTorchBlockRules plain;
  EXPECT_EQ(round_size(0, plain), 0u);
  EXPECT_EQ(round_size(1, plain), 512u);
  EXPECT_EQ(round_size(513, plain), 1024u);
  EXPECT_EQ(round_size(13 * MiB + 1, plain), 13 * MiB + 512);
  const PyTorchBlockRules rules = pytorch_block_rules(nlohmann::json::parse(
      R"({"allocator_settings": {"max_split_size": -1, "expandable_segments": false,
                                 "roundup_power2_divisions": {"1": 4, "2": 8, "4": 0, "x": 2}}})"));
  EXPECT_EQ(rules.divisions[0], 4u);
  EXPECT_EQ(rules.divisions[1], 8u);
  EXPECT_EQ(rules.max_split_size, UINT64_MAX);
  EXPECT_FALSE(rules.expandable);
  EXPECT_EQ(round_size(1126400, rules), 1310720u);                  // 1.07 MiB: the next quarter of [1, 2) MiB
  EXPECT_EQ(round_size(2048, rules), 2048u);                        // not above 512 x 4: multiples of 512
  EXPECT_EQ(round_size(3000, rules), 3072u);                        // a quarter of [2048, 4096)
  EXPECT_EQ(round_size(3 * MiB + 1, rules), 3 * MiB + 256 * 1024);  // an eighth of [2, 4) MiB
  EXPECT_EQ(round_size(4 * MiB, rules), 4 * MiB);
  EXPECT_EQ(round_size(5 * MiB + 1, rules), 5 * MiB + 512);  // [4, 8) MiB: no divisions
  EXPECT_EQ(pytorch_block_rules(nlohmann::json::parse(R"({"allocator_settings": {"max_split_size": 8388608}})"))
                .max_split_size,
            8 * MiB);
}

// Allocated bytes count blocks: an allocation freed in the trace takes the block PyTorch gave it,
// replayed from its segment's segment_alloc. These are the shapes of two real 2.11 runs whose
// peaks stowage read low: 13 MiB + x in 14 MiB segments (the 1 MiB - x left is not split off:
// 40 x 14 MiB, max_memory_allocated() 587,202,560) and 1.07 MiB with roundup_power2_divisions:4
// (50 x 1.25 MiB, 65,536,000).
TEST(InspectPyTorchLimits, FreedAllocationsCountTheirBlocks) {
  const std::uint64_t a = kBase, b = kBase + 14 * MiB;
  nlohmann::json unsplit = {
      {"segments", {segment(a, {{14 * MiB, "active_allocated"}}), segment(b, {{14 * MiB, "inactive"}})}},
      {"device_traces",
       {{entry("segment_alloc", a, 14 * MiB), entry("alloc", a, 13 * MiB + 1), entry("segment_alloc", b, 14 * MiB),
         entry("alloc", b, 13 * MiB + 5), entry("free_requested", a, 13 * MiB + 1),
         entry("free_completed", a, 13 * MiB + 1), entry("free_requested", b, 13 * MiB + 5),
         entry("free_completed", b, 13 * MiB + 5), entry("alloc", a, 13 * MiB + 100)}}}};
  Snapshot s = snapshot_from_pytorch(unsplit, "x");
  EXPECT_EQ(s.trace[3].size, 14 * MiB);
  EXPECT_EQ(s.trace[7].size, 14 * MiB);  // a free takes its allocation's block
  EXPECT_EQ(analyze(s).peak_allocated, 28 * MiB);
  EXPECT_EQ(inspect_json(pickle_file("unsplit", unsplit))["peak_allocated"], 28 * MiB);
  // With expandable segments every rest is split off: the rounded request is the block.
  unsplit["allocator_settings"] = {{"expandable_segments", true}};
  EXPECT_EQ(analyze(snapshot_from_pytorch(unsplit, "x")).peak_allocated, 2 * (13 * MiB + 512));
  // In a segment the trace did not create, the block is unknown: the rounded request.
  unsplit.erase("allocator_settings");
  unsplit["device_traces"][0].erase(2);
  EXPECT_EQ(analyze(snapshot_from_pytorch(unsplit, "x")).peak_allocated, 14 * MiB + 13 * MiB + 512);

  nlohmann::json divided = {{"segments", {segment(a, {{20 * MiB, "inactive"}})}},
                            {"device_traces", {{entry("segment_alloc", a, 20 * MiB)}}},
                            {"allocator_settings", {{"roundup_power2_divisions", {{"1", 4}}}}}};
  for (int i = 0; i < 3; ++i) divided["device_traces"][0].push_back(entry("alloc", a + i * 1310720, 1126400 + i));
  for (int i = 0; i < 3; ++i)
    divided["device_traces"][0].push_back(entry("free_requested", a + i * 1310720, 1126400 + i));
  for (int i = 0; i < 3; ++i)
    divided["device_traces"][0].push_back(entry("free_completed", a + i * 1310720, 1126400 + i));
  EXPECT_EQ(analyze(snapshot_from_pytorch(divided, "x")).peak_allocated, 3 * 1310720);
}

// The replay splits as PyTorch does (the large pool keeps a rest of more than 1 MiB, and none for
// a request of max_split_size or more) and merges free neighbours.
TEST(InspectPyTorchLimits, TheReplaySplitsAndMergesAsPyTorchDoes) {
  const std::uint64_t a = kBase;
  auto sizes = [&](const std::vector<nlohmann::json>& trace, const nlohmann::json& settings = nullptr) {
    nlohmann::json j = {{"segments", {segment(a, {{20 * MiB, "inactive"}})}},
                        {"device_traces", {nlohmann::json(trace)}}};
    if (!settings.is_null()) j["allocator_settings"] = settings;
    std::vector<std::uint64_t> out;
    for (const auto& t : snapshot_from_pytorch(j, "x").trace) out.push_back(t.size);
    return out;
  };
  // 3 MiB leaves 17 MiB: split. 16 MiB + 1 in those 17 leaves under 1 MiB: the whole 17. Freed,
  // the two merge: 19.5 MiB then takes all 20 (3 MiB alone could not hold it).
  const std::vector<nlohmann::json> t = {entry("segment_alloc", a, 20 * MiB),
                                         entry("alloc", a, 3 * MiB),
                                         entry("alloc", a + 3 * MiB, 16 * MiB + 1),
                                         entry("free_requested", a, 3 * MiB),
                                         entry("free_completed", a, 3 * MiB),
                                         entry("free_requested", a + 3 * MiB, 16 * MiB + 1),
                                         entry("free_completed", a + 3 * MiB, 16 * MiB + 1),
                                         entry("alloc", a, 19 * MiB + 512 * 1024),
                                         entry("free_requested", a, 19 * MiB + 512 * 1024)};
  EXPECT_EQ(sizes(t), (std::vector<std::uint64_t>{20 * MiB, 3 * MiB, 17 * MiB, 3 * MiB, 3 * MiB, 17 * MiB, 17 * MiB,
                                                  20 * MiB, 20 * MiB}));
  // max_split_size 8 MiB: a 10 MiB request is not split off its 20 MiB block.
  const std::vector<nlohmann::json> big = {entry("segment_alloc", a, 20 * MiB), entry("alloc", a, 10 * MiB),
                                           entry("free_requested", a, 10 * MiB)};
  EXPECT_EQ(sizes(big)[1], 10 * MiB);
  EXPECT_EQ(sizes(big, {{"max_split_size", 8 * MiB}})[1], 20 * MiB);
}
