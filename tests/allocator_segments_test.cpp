// Classic vs expandable segments: exact reserved bytes, granules given back by empty_cache,
// garbage collection under a threshold.
#include <gtest/gtest.h>

#include <cstring>

#include "allocator_test_util.hpp"
#include "stowage/fault_injection.hpp"

namespace stowage {
namespace {

using namespace test;

std::int64_t i64(std::size_t n) { return static_cast<std::int64_t>(n); }

TEST(AllocatorSegments, ExpandableMapsGranulesContiguously) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  ASSERT_EQ(a.segment_mode(), SegmentMode::expandable);
  void* x = a.allocate(3 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(4 * MiB));  // two 2 MiB granules
  void* y = a.allocate(5 * MiB);                                  // 1 MiB left over + two more granules
  EXPECT_EQ(addr(y), addr(x) + 3 * MiB);
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.reserved_bytes.all.current, i64(8 * MiB));
  EXPECT_EQ(st.allocated_bytes.all.current, i64(8 * MiB));
  EXPECT_EQ(st.num_device_alloc, 4);
  EXPECT_EQ(st.segment.all.current, 1);
  EXPECT_EQ(dev->counters().physical_allocated, 8 * MiB);
  std::memset(x, 0x11, 3 * MiB);
  std::memset(y, 0x22, 5 * MiB);
  a.deallocate(x);
  a.deallocate(y);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(8 * MiB));  // cached
  a.empty_cache();
  st = a.stats();
  EXPECT_EQ(st.reserved_bytes.all.current, 0);
  EXPECT_EQ(st.num_device_free, 4);
  EXPECT_EQ(st.inactive_split_bytes.all.current, 0);
  EXPECT_EQ(dev->counters().physical_allocated, 0u);
}

TEST(AllocatorSegments, EmptyCacheGivesBackWholeFreeGranulesOnly) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  void* x = a.allocate(3 * MiB);
  auto* y = static_cast<unsigned char*>(a.allocate(3 * MiB));  // granules 0..2 mapped
  std::memset(y, 0x5a, 3 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(6 * MiB));
  a.deallocate(x);  // [0, 3 MiB) free: granule 0 whole, granule 1 shared with y
  a.empty_cache();
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.reserved_bytes.all.current, i64(4 * MiB));
  EXPECT_EQ(st.num_device_free, 1);
  EXPECT_EQ(st.inactive_split_bytes.all.current, i64(MiB));  // [2, 3) MiB, mapped and free
  EXPECT_EQ(y[0], 0x5a);
  EXPECT_EQ(y[3 * MiB - 1], 0x5a);
  // 2 MiB more: remapping granule 0 in front of the free MiB costs one granule, at x's place.
  void* z = a.allocate(2 * MiB);
  EXPECT_EQ(z, x);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(6 * MiB));
  a.deallocate(z);
  a.deallocate(y);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes.all.current, 0);
}

TEST(AllocatorSegments, UnmappedHolesMergeAndAreRefilled) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  void* x = a.allocate(4 * MiB);  // granules 0-1
  void* y = a.allocate(4 * MiB);  // 2-3
  void* z = a.allocate(4 * MiB);  // 4-5
  a.deallocate(y);
  a.empty_cache();  // hole 2-3
  a.deallocate(x);
  a.empty_cache();  // hole 0-1 joins it: 0-3
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(4 * MiB));
  void* w = a.allocate(8 * MiB);  // fits the joined hole exactly, below z
  EXPECT_EQ(w, x);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(12 * MiB));
  Snapshot s = a.snapshot();
  ASSERT_EQ(s.segments.size(), 1u);
  ASSERT_EQ(s.segments[0].blocks.size(), 2u);  // w then z, contiguous again
  EXPECT_EQ(s.segments[0].blocks[1].address, addr(z));
  a.deallocate(w);
  a.deallocate(z);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes.all.current, 0);
  EXPECT_EQ(dev->counters().physical_allocated, 0u);
}

TEST(AllocatorSegments, ClassicSegmentsAreWholeDeviceAllocations) {
  auto dev = small_device();
  CachingAllocator a(*dev, classic_options());
  void* x = a.allocate(3 * MiB);   // a 20 MiB segment
  void* y = a.allocate(30 * MiB);  // its own 30 MiB segment
  void* z = a.allocate(4 * MiB);   // shares x's segment
  EXPECT_EQ(addr(z), addr(x) + 3 * MiB);
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.reserved_bytes.all.current, i64(50 * MiB));
  EXPECT_EQ(st.num_device_alloc, 2);
  EXPECT_EQ(dev->counters().raw_allocated, 50 * MiB);
  a.deallocate(y);
  a.deallocate(x);
  a.empty_cache();  // the 30 MiB segment goes; the 20 MiB one still holds z
  st = a.stats();
  EXPECT_EQ(st.reserved_bytes.all.current, i64(20 * MiB));
  EXPECT_EQ(st.num_device_free, 1);
  EXPECT_EQ(st.num_sync_all_streams, 1);
  a.deallocate(z);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes.all.current, 0);
  EXPECT_EQ(dev->counters().raw_allocated, 0u);
}

// An emulated device that says it has no virtual memory.
class NoVmmDevice : public FaultInjectingDevice {
 public:
  NoVmmDevice() : FaultInjectingDevice(small_device(), FaultPlan{}) {
    props_ = FaultInjectingDevice::properties();
    props_.virtual_memory = false;
    props_.granularity = 0;
  }
  const DeviceProperties& properties() const override { return props_; }

 private:
  DeviceProperties props_;
};

TEST(AllocatorSegments, ClassicFallbackWithoutVirtualMemory) {
  NoVmmDevice dev;
  CachingAllocator a(dev);
  EXPECT_EQ(a.options().segments, SegmentMode::expandable);
  EXPECT_EQ(a.segment_mode(), SegmentMode::classic);
  void* p = a.allocate(MiB);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(2 * MiB));
  EXPECT_EQ(dev.counters().raw_allocated, 2 * MiB);
  a.deallocate(p);
}

TEST(AllocatorSegments, FailedGranuleMapIsRolledBackAndRetried) {
  FaultInjectingDevice dev(small_device(), FaultPlan{.allocation_every = 3});
  CachingAllocator a(dev);
  void* x = a.allocate(4 * MiB);  // physical chunks 1 and 2
  void* y = a.allocate(4 * MiB);  // chunk 3 refused: cache freed, retried with chunks 4 and 5
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.num_alloc_retries, 1);
  EXPECT_EQ(st.num_ooms, 0);
  EXPECT_EQ(st.reserved_bytes.all.current, i64(8 * MiB));
  EXPECT_EQ(dev.counters().physical_allocated, 8 * MiB);
  EXPECT_EQ(addr(y), addr(x) + 4 * MiB);
  a.deallocate(x);
  a.deallocate(y);
}

TEST(AllocatorSegments, RefusedSecondGranuleLeavesNothingMapped) {
  FaultInjectingDevice dev(small_device(), FaultPlan{.allocation_every = 2});
  CachingAllocator a(dev);
  // Chunk 1 maps, chunk 2 is refused (rolled back); the retry's chunk 3 maps and 4 is refused.
  EXPECT_THROW(a.allocate(4 * MiB), OutOfMemory);
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.num_ooms, 1);
  EXPECT_EQ(st.num_alloc_retries, 1);
  EXPECT_EQ(st.reserved_bytes.all.current, 0);
  EXPECT_EQ(st.allocated_bytes.all.current, 0);
  EXPECT_EQ(dev.counters().physical_allocated, 0u);
  dev.set_plan(FaultPlan{});
  void* p = a.allocate(4 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(4 * MiB));
  a.deallocate(p);
}

TEST(AllocatorSegments, MaxSplitSizeKeepsBigBlocksWhole) {
  auto dev = small_device();
  AllocatorOptions o = classic_options();
  o.max_split_size = 24 * MiB;
  CachingAllocator a(*dev, o);
  void* big = a.allocate(30 * MiB);
  a.deallocate(big);
  void* small = a.allocate(2 * MiB);  // must not carve the 30 MiB block: a new 20 MiB segment
  EXPECT_NE(small, big);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(50 * MiB));
  void* mid = a.allocate(25 * MiB);  // takes the 30 MiB block whole (waste under 20 MiB)
  EXPECT_EQ(mid, big);
  EXPECT_EQ(a.block_size(mid), 30 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(50 * MiB));
  a.deallocate(mid);
  a.deallocate(small);
  o.max_split_size = 20 * MiB;  // must exceed the 20 MiB segments it would otherwise lock up
  EXPECT_THROW(CachingAllocator(*dev, o), InvalidArgument);
  EXPECT_THROW(parse_allocator_options("max_split_size_mb:20"), ParseError);
}

TEST(AllocatorSegments, MaxSplitSizeServesARequestWhoseSegmentRoundsPastIt) {
  auto dev = small_device();
  AllocatorOptions o = classic_options();
  o.max_split_size = 25 * MiB;
  CachingAllocator a(*dev, o);
  const std::size_t just_under = 24 * MiB + 1;  // its segment is 26 MiB, past max_split
  void* p = a.allocate(just_under);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(a.block_size(p), 26 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(26 * MiB));
  a.deallocate(p);
  void* again = a.allocate(just_under);  // the cached segment serves it: no second one
  EXPECT_EQ(again, p);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(26 * MiB));
  a.deallocate(again);
  void* small = a.allocate(2 * MiB);  // a 20 MiB segment of its own: the 26 MiB block stays whole
  EXPECT_NE(small, p);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(46 * MiB));
  a.deallocate(small);
  EXPECT_EQ(a.stats().num_alloc_retries, 0);
}

TEST(AllocatorSegments, EmptyCacheWaitsForPendingBlocks) {
  auto dev = small_device();
  CachingAllocator a(*dev, classic_options());
  Stream s2 = dev->create_stream();
  void* x = a.allocate(12 * MiB);
  a.record_stream(x, s2);
  a.deallocate(x);
  EXPECT_EQ(a.stats().active_bytes.all.current, i64(12 * MiB));
  a.empty_cache();  // synchronises, completes the pending free, gives the segment back
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.active_bytes.all.current, 0);
  EXPECT_EQ(st.reserved_bytes.all.current, 0);
  EXPECT_EQ(st.num_device_free, 1);
  dev->destroy_stream(s2);
}

TEST(AllocatorSegments, GarbageCollectionFreesOldestCachedSegments) {
  auto dev = small_device();
  AllocatorOptions o = classic_options();
  o.memory_cap_bytes = 64 * MiB;
  o.gc_threshold = 0.5;  // 32 MiB
  CachingAllocator a(*dev, o);
  void* x = a.allocate(12 * MiB);  // its own 12 MiB segment
  a.deallocate(x);
  void* y = a.allocate(16 * MiB);  // 12 + 16 = 28: under the threshold, nothing collected
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(28 * MiB));
  void* z = a.allocate(14 * MiB);  // 28 + 14 would pass it: the cached 12 MiB segment goes first
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.reserved_bytes.all.current, i64(30 * MiB));
  EXPECT_EQ(st.num_device_free, 1);
  EXPECT_EQ(st.num_alloc_retries, 0);
  a.deallocate(y);
  a.deallocate(z);
}

// As PyTorch, which collects only under a memory fraction below 1: without a cap the threshold
// does nothing (it used to collect against the device's capacity), and a fraction of 1 is none.
TEST(AllocatorSegments, GarbageCollectionActsOnlyUnderACap) {
  auto dev = small_device();
  AllocatorOptions o = classic_options();
  o.gc_threshold = 0.1;  // of the 256 MiB capacity: 25.6 MiB, were it a cap
  CachingAllocator a(*dev, o);
  void* x = a.allocate(12 * MiB);
  a.deallocate(x);
  void* y = a.allocate(16 * MiB);  // 12 + 16 past 25.6: nothing collected without a cap
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(28 * MiB));
  EXPECT_EQ(a.stats().num_device_free, 0);
  a.set_memory_fraction(1.0);  // no cap, as in PyTorch
  void* z = a.allocate(14 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, i64(42 * MiB));
  EXPECT_EQ(a.stats().num_device_free, 0);
  a.deallocate(z);
  a.set_memory_fraction(0.25);     // 64 MiB: collecting past 6.4 MiB
  void* w = a.allocate(18 * MiB);  // the two cached segments go first
  const AllocatorStats st = a.stats();
  EXPECT_EQ(st.reserved_bytes.all.current, i64(16 * MiB + 18 * MiB));
  EXPECT_EQ(st.num_device_free, 2);
  a.deallocate(w);
  a.deallocate(y);
}

}  // namespace
}  // namespace stowage
