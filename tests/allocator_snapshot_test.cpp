// Snapshots (segments, blocks, tags, trace ring), their JSON round trip, stats JSON, options text.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "allocator_test_util.hpp"
#include "nlohmann/json.hpp"

namespace stowage {
namespace {

using namespace test;
using ::testing::HasSubstr;

TEST(AllocatorSnapshot, BlocksCarryTagsAndStates) {
  auto dev = small_device();
  AllocatorOptions o = classic_options();
  o.trace_entries = 64;
  CachingAllocator a(*dev, o);
  void *x, *y;
  {
    ScopedTag model("model");
    x = a.allocate(1000);
    {
      ScopedTag attn("layer3.attn");
      EXPECT_EQ(ScopedTag::current(), "layer3.attn");
      y = a.allocate(3000);
    }
    EXPECT_EQ(ScopedTag::current(), "model");
  }
  EXPECT_EQ(ScopedTag::current(), "");
  Snapshot s = a.snapshot();
  EXPECT_EQ(s.capacity, 256 * MiB);
  ASSERT_EQ(s.segments.size(), 1u);
  const SegmentInfo& seg = s.segments[0];
  EXPECT_EQ(seg.total_size, 2 * MiB);
  EXPECT_EQ(seg.pool, Pool::small);
  EXPECT_FALSE(seg.expandable);
  EXPECT_EQ(seg.allocated_size, 1024u + 3072u);
  ASSERT_EQ(seg.blocks.size(), 3u);
  EXPECT_EQ(seg.blocks[0].address, addr(x));
  EXPECT_EQ(seg.blocks[0].requested_size, 1000u);
  EXPECT_EQ(seg.blocks[0].tag, "model");
  EXPECT_EQ(seg.blocks[0].state, BlockState::active_allocated);
  EXPECT_EQ(seg.blocks[1].address, addr(y));
  EXPECT_EQ(seg.blocks[1].size, 3072u);
  EXPECT_EQ(seg.blocks[1].tag, "layer3.attn");
  EXPECT_EQ(seg.blocks[2].state, BlockState::inactive);
  EXPECT_EQ(seg.blocks[2].size, 2 * MiB - 4096);
  a.deallocate(y);
  a.deallocate(x);
  s = a.snapshot();
  std::vector<TraceAction> actions;
  for (const TraceEntry& t : s.trace) actions.push_back(t.action);
  EXPECT_EQ(actions, (std::vector<TraceAction>{TraceAction::segment_map, TraceAction::alloc, TraceAction::alloc,
                                               TraceAction::free_requested, TraceAction::free_completed,
                                               TraceAction::free_requested, TraceAction::free_completed}));
  EXPECT_EQ(s.trace[2].tag, "layer3.attn");
  EXPECT_EQ(s.trace[2].address, addr(y));
  for (std::size_t i = 1; i < s.trace.size(); ++i) EXPECT_LE(s.trace[i - 1].time_ns, s.trace[i].time_ns);
}

// Tags that end out of order (a stack of them destroyed front to back, as a vector's elements
// are at thread exit) leave the nest and name no freed tag (ASan checks the reads).
TEST(AllocatorSnapshot, TagsEndingOutOfOrderLeaveTheNest) {
  std::vector<std::unique_ptr<ScopedTag>> tags;
  tags.push_back(std::make_unique<ScopedTag>("outer"));
  tags.push_back(std::make_unique<ScopedTag>("middle"));
  tags.push_back(std::make_unique<ScopedTag>("inner"));
  tags.erase(tags.begin() + 1);  // the middle one ends first
  EXPECT_EQ(ScopedTag::current(), "inner");
  tags.erase(tags.begin());  // then the outermost
  EXPECT_EQ(ScopedTag::current(), "inner");
  tags.clear();
  EXPECT_EQ(ScopedTag::current(), "");
  {
    ScopedTag a("a");
    auto b = std::make_unique<ScopedTag>("b");
    { ScopedTag c("c"); }
    EXPECT_EQ(ScopedTag::current(), "b");
    b.reset();
    EXPECT_EQ(ScopedTag::current(), "a");
  }
  EXPECT_EQ(ScopedTag::current(), "");
}

// A trace entry carries the tag of the thread whose call caused it, not the block's: a free in
// step 1 of a block allocated in step 0 is step 1's (step marks read it), and a free that waits
// on another stream completes under the tag of the call that finds the stream done.
TEST(AllocatorSnapshot, TraceEntriesCarryTheTagOfTheCallThatCausedThem) {
  auto dev = small_device();
  AllocatorOptions o = classic_options();
  o.trace_entries = 64;
  CachingAllocator a(*dev, o);
  const Stream s1 = dev->create_stream(), s2 = dev->create_stream();
  void *x = nullptr, *y = nullptr;
  {
    ScopedTag tag("step 0");
    x = a.allocate(4096, s1);
    y = a.allocate(4096, s1);
  }
  {
    ScopedTag tag("step 1");
    a.deallocate(x);  // completes at once
    a.record_stream(y, s2);
    a.deallocate(y);  // pending until s2 gets there
  }
  dev->synchronize(s2);
  {
    ScopedTag tag("step 2");
    a.deallocate(a.allocate(4096, s1));  // the allocation finds s2 done first
  }
  {
    ScopedTag tag("step 3");
    a.empty_cache();
  }
  std::vector<std::pair<TraceAction, std::string>> got;
  for (const TraceEntry& t : a.snapshot().trace) got.emplace_back(t.action, t.tag);
  using T = TraceAction;
  EXPECT_EQ(got, (std::vector<std::pair<TraceAction, std::string>>{{T::segment_map, "step 0"},
                                                                   {T::alloc, "step 0"},
                                                                   {T::alloc, "step 0"},
                                                                   {T::free_requested, "step 1"},
                                                                   {T::free_completed, "step 1"},
                                                                   {T::free_requested, "step 1"},
                                                                   {T::free_completed, "step 2"},
                                                                   {T::alloc, "step 2"},
                                                                   {T::free_requested, "step 2"},
                                                                   {T::free_completed, "step 2"},
                                                                   {T::segment_unmap, "step 3"}}));
  const std::vector<TraceEntry> trace = a.snapshot().trace;
  ASSERT_EQ(trace.size(), 11u);
  EXPECT_EQ(trace[3].address, addr(x));
  EXPECT_EQ(trace[6].address, addr(y));
  // The blocks' own tags stay where they were allocated.
  {
    ScopedTag tag("step 4");
    x = a.allocate(4096, s1);
  }
  {
    ScopedTag tag("step 5");
    EXPECT_EQ(a.snapshot().segments.at(0).blocks.at(0).tag, "step 4");
  }
  a.deallocate(x);
  dev->destroy_stream(s1);
  dev->destroy_stream(s2);
}

TEST(AllocatorSnapshot, TraceRingKeepsTheNewest) {
  auto dev = small_device();
  AllocatorOptions o;
  o.trace_entries = 4;
  CachingAllocator a(*dev, o);
  std::vector<void*> ps;
  for (int i = 0; i < 10; ++i) ps.push_back(a.allocate(512));
  Snapshot s = a.snapshot();
  ASSERT_EQ(s.trace.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(s.trace[i].action, TraceAction::alloc);
    EXPECT_EQ(s.trace[i].address, addr(ps[6 + i]));
  }
  for (void* p : ps) a.deallocate(p);
}

TEST(AllocatorSnapshot, JsonRoundTrip) {
  auto dev = small_device();
  AllocatorOptions o;
  o.trace_entries = 16;
  CachingAllocator a(*dev, o);
  Stream s1 = dev->create_stream();
  ScopedTag tag("opt.state \"m\"");
  void* x = a.allocate(5 * MiB, s1);
  void* y = a.allocate(700);
  a.record_stream(y, s1);
  const std::string text = to_json(a.snapshot());
  Snapshot back = snapshot_from_json(text);
  EXPECT_EQ(to_json(back), text);
  ASSERT_EQ(back.segments.size(), 2u);  // one expandable reservation per pool
  EXPECT_TRUE(back.segments[0].expandable);
  EXPECT_EQ(back.stats.allocated_bytes.all.current, static_cast<std::int64_t>(5 * MiB + 1024));
  bool found = false;
  for (const auto& seg : back.segments) {
    for (const auto& b : seg.blocks) {
      if (b.address == addr(x)) {
        found = true;
        EXPECT_EQ(b.stream, s1);
        EXPECT_EQ(b.tag, "opt.state \"m\"");
      }
    }
  }
  EXPECT_TRUE(found);
  a.deallocate(x);
  a.deallocate(y);
  dev->synchronize();
  dev->destroy_stream(s1);
}

TEST(AllocatorSnapshot, ATagThatIsNotUtf8IsWrittenWithReplacementCharacters) {
  auto dev = small_device();
  AllocatorOptions o;
  o.trace_entries = 16;
  CachingAllocator a(*dev, o);
  void* x = nullptr;
  {
    ScopedTag tag("attn.\xC3");  // "attn.é" cut after its first byte
    x = a.allocate(4096);
  }
  a.deallocate(x);  // the trace still holds the tag
  const Snapshot back = snapshot_from_json(to_json(a.snapshot()));
  int tagged = 0;
  for (const TraceEntry& t : back.trace) {
    if (t.tag.empty()) continue;
    EXPECT_EQ(t.tag, "attn.\xEF\xBF\xBD");  // U+FFFD
    ++tagged;
  }
  EXPECT_GE(tagged, 1);
}

TEST(AllocatorSnapshot, MalformedJsonNamesTheField) {
  auto dev = small_device();
  CachingAllocator a(*dev, classic_options());
  void* x = a.allocate(100);
  nlohmann::json j = nlohmann::json::parse(to_json(a.snapshot()));
  a.deallocate(x);
  auto message = [](const nlohmann::json& doc) -> std::string {
    try {
      snapshot_from_json(doc.dump());
    } catch (const ParseError& e) {
      return e.what();
    }
    return "no error";
  };
  nlohmann::json bad = j;
  bad["segments"][0]["blocks"][0]["size"] = "big";
  EXPECT_THAT(message(bad), HasSubstr("segments[0].blocks[0].size"));
  bad = j;
  bad["segments"][0]["blocks"][0]["state"] = "sleeping";
  EXPECT_THAT(message(bad), HasSubstr("segments[0].blocks[0].state"));
  bad = j;
  bad["stats"].erase("num_ooms");
  EXPECT_THAT(message(bad), HasSubstr("stats.num_ooms: missing"));
  bad = j;
  bad["trace"] = 3;
  EXPECT_THAT(message(bad), HasSubstr("snapshot.trace: expected an array"));
  EXPECT_THROW(snapshot_from_json("{not json"), ParseError);
}

// Every malformed value surfaces as ParseError naming the field, never as the JSON library's
// own exception (type_error, out_of_range) escaping to the caller.
TEST(AllocatorSnapshot, WrongTypesAndOutOfRangeNumbersAreParseErrors) {
  auto dev = small_device();
  AllocatorOptions o = classic_options();
  o.trace_entries = 8;
  CachingAllocator a(*dev, o);
  void* x = a.allocate(100);
  const std::string good = to_json(a.snapshot());
  a.deallocate(x);
  const nlohmann::json j = nlohmann::json::parse(good);
  auto message = [](const std::string& text) -> std::string {
    try {
      snapshot_from_json(text);
    } catch (const ParseError& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("wrong exception: ") + e.what();
    }
    return "no error";
  };
  ASSERT_EQ(message(good), "no error");
  // wrong types
  nlohmann::json bad = j;
  bad["device_name"] = 7;
  EXPECT_THAT(message(bad.dump()), HasSubstr("snapshot.device_name: expected a string"));
  bad = j;
  bad["segments"][0]["expandable"] = "yes";
  EXPECT_THAT(message(bad.dump()), HasSubstr("segments[0].expandable: expected true or false"));
  bad = j;
  bad["segments"][0] = 5;
  EXPECT_THAT(message(bad.dump()), HasSubstr("segments[0]: expected an object"));
  bad = j;
  bad["stats"] = nlohmann::json::array({1, 2});
  EXPECT_THAT(message(bad.dump()), HasSubstr("snapshot.stats: expected an object"));
  bad = j;
  bad["trace"][0]["time_ns"] = 1.5;
  EXPECT_THAT(message(bad.dump()), HasSubstr("trace[0].time_ns: expected an integer"));
  bad = j;
  bad["capacity"] = -1;
  EXPECT_THAT(message(bad.dump()), HasSubstr("snapshot.capacity: expected an unsigned integer"));
  // out of range: an unsigned value above 2^63-1 in a signed field, a device beyond int
  bad = j;
  bad["stats"]["num_ooms"] = std::uint64_t{1} << 63;
  EXPECT_THAT(message(bad.dump()), HasSubstr("stats.num_ooms: 9223372036854775808 is out of range"));
  bad = j;
  bad["trace"][0]["time_ns"] = ~std::uint64_t{0};
  EXPECT_THAT(message(bad.dump()), HasSubstr("trace[0].time_ns: 18446744073709551615 is out of range"));
  bad = j;
  bad["device"] = std::int64_t{1} << 40;
  EXPECT_THAT(message(bad.dump()), HasSubstr("snapshot.device: 1099511627776 is out of range for an int"));
  // numbers the JSON library itself cannot hold, and nesting no snapshot has
  std::string overflow = good;
  overflow.replace(overflow.find("\"capacity\": ") + 12, 1, "1e999");
  EXPECT_THAT(message(overflow), HasSubstr("snapshot: unreadable JSON"));
  EXPECT_THAT(message("{\"version\": 1, \"device\": 1e400}"), HasSubstr("snapshot: unreadable JSON"));
  EXPECT_THAT(message(std::string(100, '[') + std::string(100, ']')), HasSubstr("nested deeper than 16 levels"));
  // a value that is a big integer also stays out of unsigned fields: the reader refuses floats
  bad = j;
  bad["capacity"] = 1e30;
  EXPECT_THAT(message(bad.dump()), HasSubstr("snapshot.capacity: expected an unsigned integer"));
}

TEST(AllocatorSnapshot, TextThatIsNoObjectSaysItsContextOnce) {
  auto message = [](const std::string& text) -> std::string {
    try {
      snapshot_from_json(text);
    } catch (const ParseError& e) {
      return e.what();
    }
    return "no error";
  };
  // The top level is the snapshot itself: no path to name ("snapshot: snapshot: ..." before).
  EXPECT_EQ(message("5"), "snapshot: expected an object, found a number");
  EXPECT_EQ(message("[1, 2]"), "snapshot: expected an object, found an array");
  EXPECT_EQ(message("\"x\""), "snapshot: expected an object, found a string");
  EXPECT_EQ(message("null"), "snapshot: expected an object, found null");
  // Below it, the path as before.
  EXPECT_EQ(message(R"({"version": 1, "device": 0, "device_name": "d", "capacity": 1, "stats": 5})"),
            "snapshot: snapshot.stats: expected an object, found a number");
}

TEST(AllocatorStatsJson, FlatPyTorchKeys) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  void* x = a.allocate(3 * MiB);
  nlohmann::json j = nlohmann::json::parse(to_json(a.stats()));
  EXPECT_EQ(j["allocated_bytes.all.current"], 3 * MiB);
  EXPECT_EQ(j["allocated_bytes.large_pool.current"], 3 * MiB);
  EXPECT_EQ(j["allocated_bytes.small_pool.current"], 0);
  EXPECT_EQ(j["reserved_bytes.all.peak"], 4 * MiB);
  EXPECT_EQ(j["requested_bytes.all.allocated"], 3 * MiB);
  EXPECT_EQ(j["num_device_alloc"], 2);
  EXPECT_EQ(j["num_thread_cache_hits"], 0);
  EXPECT_EQ(j["thread_cache_bytes"], 0);
  EXPECT_EQ(j.size(), 7u * 3 * 4 + 8);
  a.deallocate(x);
}

TEST(AllocatorOptionsText, ParsesPyTorchAndStowageKeys) {
  AllocatorOptions o = parse_allocator_options(
      "expandable_segments:False, max_split_size_mb:512,garbage_collection_threshold:0.8,"
      "memory_cap_mb:100,memory_cap_fraction:0.5,trace_entries:64,expandable_reserve_mb:1024");
  EXPECT_EQ(o.segments, SegmentMode::classic);
  EXPECT_EQ(o.max_split_size, 512 * MiB);
  EXPECT_DOUBLE_EQ(o.gc_threshold, 0.8);
  EXPECT_EQ(o.memory_cap_bytes, 100 * MiB);
  EXPECT_DOUBLE_EQ(o.memory_cap_fraction, 0.5);
  EXPECT_EQ(o.trace_entries, 64u);
  EXPECT_EQ(o.expandable_reserve, 1024 * MiB);
  EXPECT_EQ(parse_allocator_options("", o).max_split_size, 512 * MiB);  // base kept
  EXPECT_EQ(parse_allocator_options("expandable_segments:True", o).segments, SegmentMode::expandable);
}

// PyTorch's per_process_memory_fraction keeps PyTorch's meaning (CUDAAllocatorConfig, then
// setMemoryFraction): 1, its default, is no cap; 0 a cap no reservation fits. stowage's own
// memory_cap_fraction keeps 0 as "none".
TEST(AllocatorOptionsText, PyTorchsMemoryFractionMeansWhatItMeansThere) {
  AllocatorOptions o = parse_allocator_options("per_process_memory_fraction:0.25");
  EXPECT_DOUBLE_EQ(o.memory_cap_fraction, 0.25);
  EXPECT_EQ(o.memory_cap_bytes, 0u);
  o = parse_allocator_options("per_process_memory_fraction:1");
  EXPECT_DOUBLE_EQ(o.memory_cap_fraction, 0.0);
  EXPECT_EQ(o.memory_cap_bytes, 0u);
  o = parse_allocator_options("per_process_memory_fraction:0,per_process_memory_fraction:0.5");
  EXPECT_DOUBLE_EQ(o.memory_cap_fraction, 0.5);  // the last one wins, as in PyTorch
  EXPECT_EQ(o.memory_cap_bytes, 0u);
  o = parse_allocator_options("per_process_memory_fraction:0,memory_cap_mb:1000");
  EXPECT_EQ(o.memory_cap_bytes, 1000 * MiB);
  o = parse_allocator_options("per_process_memory_fraction:0");
  EXPECT_EQ(o.memory_cap_bytes, 0u);
  auto dev = small_device();
  CachingAllocator a(*dev, o);
  EXPECT_EQ(a.memory_cap(), 1u);
  EXPECT_THROW(a.allocate(512), OutOfMemory);
  o = parse_allocator_options("memory_cap_fraction:0");
  EXPECT_DOUBLE_EQ(o.memory_cap_fraction, 0.0);
  EXPECT_EQ(o.memory_cap_bytes, 0u);
}

TEST(AllocatorOptionsText, BadTextNamesTheKey) {
  auto message = [](const std::string& text) -> std::string {
    try {
      parse_allocator_options(text);
    } catch (const ParseError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_THAT(message("roundup_bypass:1"), HasSubstr("unknown key \"roundup_bypass\""));
  EXPECT_THAT(message("max_split_size_mb:abc"), HasSubstr("max_split_size_mb"));
  EXPECT_THAT(message("garbage_collection_threshold:1.5"), HasSubstr("garbage_collection_threshold"));
  // PyTorch refuses both ends ("garbage_collect_threshold too small/too big").
  EXPECT_EQ(message("garbage_collection_threshold:0"),
            "allocator options: garbage_collection_threshold: must lie strictly between 0 and 1, got 0");
  EXPECT_EQ(message("garbage_collection_threshold:1.0"),
            "allocator options: garbage_collection_threshold: must lie strictly between 0 and 1, got 1.0");
  EXPECT_THAT(message("expandable_segments:maybe"), HasSubstr("expandable_segments"));
  EXPECT_THAT(message("memory_cap_mb"), HasSubstr("expected key:value"));
}

}  // namespace
}  // namespace stowage
