// Size classes, pools, splitting, coalescing and same-stream reuse.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "allocator/address_map.hpp"
#include "allocator/size_classes.hpp"
#include "allocator_test_util.hpp"

namespace stowage {
namespace {

using namespace test;

TEST(AllocatorSizeClasses, RoundsTo512AndPicksPool) {
  EXPECT_EQ(detail::round_size(1), 512u);
  EXPECT_EQ(detail::round_size(512), 512u);
  EXPECT_EQ(detail::round_size(513), 1024u);
  EXPECT_EQ(detail::round_size(MiB), MiB);
  EXPECT_EQ(detail::pool_for(MiB), Pool::small);
  EXPECT_EQ(detail::pool_for(MiB + 512), Pool::large);
  EXPECT_EQ(detail::classic_segment_size(512), 2 * MiB);
  EXPECT_EQ(detail::classic_segment_size(MiB + 512), 20 * MiB);
  EXPECT_EQ(detail::classic_segment_size(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(detail::classic_segment_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(detail::classic_segment_size(11 * MiB + 1), 12 * MiB);
}

TEST(AllocatorAddressMap, MatchesStdMapUnderChurn) {
  detail::AddressMap m;
  std::map<std::uintptr_t, detail::Block*> ref;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const std::uintptr_t key = (rng() % 5000 + 1) * 512;  // collisions and re-inserts
    auto* value = reinterpret_cast<detail::Block*>(key * 3);
    if (ref.count(key)) {
      ASSERT_EQ(m.find(key), ref[key]);
      ASSERT_TRUE(m.erase(key));
      ref.erase(key);
    } else {
      ASSERT_EQ(m.find(key), nullptr);
      m.insert(key, value);
      ref[key] = value;
    }
  }
  EXPECT_EQ(m.size(), ref.size());
  for (auto [k, v] : ref) ASSERT_EQ(m.find(k), v);
  EXPECT_FALSE(m.erase(512 * 6000));
}

TEST(AllocatorBlocks, ClassicPoolsAndSegmentSizes) {
  auto dev = small_device();
  CachingAllocator a(*dev, classic_options());
  ASSERT_EQ(a.segment_mode(), SegmentMode::classic);
  void* s = a.allocate(100);
  EXPECT_EQ(a.block_size(s), 512u);
  void* l = a.allocate(3 * MiB);
  void* h = a.allocate(30 * MiB + 1);
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.reserved_bytes.small_pool.current, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(st.reserved_bytes.large_pool.current, static_cast<std::int64_t>(20 * MiB + 32 * MiB));
  EXPECT_EQ(st.allocated_bytes.all.current, static_cast<std::int64_t>(512 + 3 * MiB + 30 * MiB + 512));
  EXPECT_EQ(st.requested_bytes.all.current, static_cast<std::int64_t>(100 + 3 * MiB + 30 * MiB + 1));
  EXPECT_EQ(st.segment.all.current, 3);
  EXPECT_EQ(st.num_device_alloc, 3);
  EXPECT_EQ(st.allocation.all.current, 3);
  for (void* p : {s, l, h}) a.deallocate(p);
  EXPECT_EQ(a.stats().allocated_bytes.all.current, 0);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, static_cast<std::int64_t>(54 * MiB));
}

TEST(AllocatorBlocks, SplitAndCoalesceExactAddresses) {
  auto dev = small_device();
  CachingAllocator a(*dev, without_thread_caches(classic_options()));
  void* p0 = a.allocate(1000);  // 1024
  void* p1 = a.allocate(4096);
  void* p2 = a.allocate(512);
  EXPECT_EQ(addr(p1), addr(p0) + 1024);
  EXPECT_EQ(addr(p2), addr(p1) + 4096);
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.segment.all.current, 1);
  EXPECT_EQ(st.inactive_split_bytes.small_pool.current, static_cast<std::int64_t>(2 * MiB - 1024 - 4096 - 512));

  a.deallocate(p1);  // a hole of 4096 between two live blocks
  EXPECT_EQ(a.stats().inactive_split_bytes.small_pool.current, static_cast<std::int64_t>(2 * MiB - 1024 - 512));
  void* q = a.allocate(2048);  // best fit: the hole, not the tail
  EXPECT_EQ(addr(q), addr(p1));
  void* r = a.allocate(2048);  // the rest of the hole
  EXPECT_EQ(addr(r), addr(p1) + 2048);
  a.deallocate(q);
  a.deallocate(r);  // coalesces back into one 4096 hole
  void* whole = a.allocate(4096);
  EXPECT_EQ(addr(whole), addr(p1));
  for (void* p : {p0, p2, whole}) a.deallocate(p);
  // Everything merged into one free block spanning the segment: no split bytes left.
  st = a.stats();
  EXPECT_EQ(st.inactive_split_bytes.all.current, 0);
  EXPECT_EQ(st.active_bytes.all.current, 0);
  void* big = a.allocate(MiB);
  EXPECT_EQ(addr(big), addr(p0));
  a.deallocate(big);
}

// A peak is a value some caller could have read: growing an expandable segment for an allocation
// used to count the new granule as inactive split bytes for an instant inside the call (peak 2 MiB
// after one 4000-byte allocation, whose current value never passed 2 MiB - 4096).
TEST(AllocatorBlocks, ExpandableGrowthLeavesNoPeakNoCallerSaw) {
  auto dev = small_device();
  AllocatorOptions o;
  o.segments = SegmentMode::expandable;
  CachingAllocator a(*dev, without_thread_caches(o));
  ASSERT_EQ(a.segment_mode(), SegmentMode::expandable);
  void* p = a.allocate(4000);
  const AllocatorStats st = a.stats();
  EXPECT_EQ(st.inactive_split_bytes.all.current, static_cast<std::int64_t>(2 * MiB - 4096));
  EXPECT_EQ(st.inactive_split_bytes.all.peak, st.inactive_split_bytes.all.current);
  a.deallocate(p);  // the whole mapped granule is free: a caller now reads it as inactive
  EXPECT_EQ(a.stats().inactive_split_bytes.all.current, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(a.stats().inactive_split_bytes.all.peak, static_cast<std::int64_t>(2 * MiB));
}

TEST(AllocatorBlocks, SameStreamReuseIsImmediate) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  Stream s = dev->create_stream();
  void* p = a.allocate(64 * KiB, s);
  a.deallocate(p);
  void* q = a.allocate(64 * KiB, s);
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats().num_device_alloc, 1);
  EXPECT_EQ(a.stats().num_stream_waits, 0);
  a.deallocate(q);
  dev->synchronize();
  dev->destroy_stream(s);
}

TEST(AllocatorBlocks, ZeroBytesGivesNull) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  EXPECT_EQ(a.allocate(0), nullptr);
  a.deallocate(nullptr);
  EXPECT_EQ(a.stats().allocation.all.allocated, 0);
}

TEST(AllocatorBlocks, MemoryIsWritableAndPeaksReset) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  auto* p = static_cast<unsigned char*>(a.allocate(3 * MiB));
  for (std::size_t i = 0; i < 3 * MiB; i += 4096) p[i] = static_cast<unsigned char>(i >> 12);
  for (std::size_t i = 0; i < 3 * MiB; i += 4096) ASSERT_EQ(p[i], static_cast<unsigned char>(i >> 12));
  a.deallocate(p);
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.allocated_bytes.all.peak, static_cast<std::int64_t>(3 * MiB));
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().allocated_bytes.all.peak, 0);
  EXPECT_EQ(a.stats().reserved_bytes.all.peak, a.stats().reserved_bytes.all.current);
}

}  // namespace
}  // namespace stowage
