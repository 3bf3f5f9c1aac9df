// Stream-ordered reuse: same stream at once, other streams only after a device-side wait on the
// point where the block was freed, record_stream, and pending blocks handed out instead of growing.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "allocator_test_util.hpp"

namespace stowage {
namespace {

using namespace test;

// Holds a stream inside a host function until release(); records what ran in which order.
struct Gate {
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  void hold(Device& dev, Stream s, std::function<void()> after) {
    auto f = opened;
    dev.launch_host(s, [f, after = std::move(after)] {
      f.wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // give a missing wait a chance to show
      after();
    });
  }
  void release() { open.set_value(); }
};

struct Order {
  std::mutex mu;
  std::vector<std::string> seen;
  void push(std::string s) {
    std::lock_guard l(mu);
    seen.push_back(std::move(s));
  }
};

TEST(AllocatorStreams, FreeOnOneStreamReusedOnAnotherOnlyAfterWait) {
  auto dev = small_device();
  CachingAllocator a(*dev, classic_options());
  Stream s1 = dev->create_stream(), s2 = dev->create_stream();
  auto* x = static_cast<std::uint32_t*>(a.allocate(MiB, s1));
  void* y = a.allocate(MiB, s1);  // the 2 MiB segment is full
  Gate gate;
  gate.hold(*dev, s1, [x] { x[0] = 0xAAAAAAAA; });  // s1 still writes x after the free below
  a.deallocate(x);
  auto* z = static_cast<std::uint32_t*>(a.allocate(MiB, s2));
  EXPECT_EQ(z, x) << "the free block on s1 should be handed to s2 rather than growing the pool";
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.num_stream_waits, 1);
  EXPECT_EQ(st.num_device_alloc, 1);
  EXPECT_EQ(st.reserved_bytes.all.current, static_cast<std::int64_t>(2 * MiB));
  dev->launch_host(s2, [z] { z[0] = 0xBBBBBBBB; });  // must run after s1's write
  gate.release();
  dev->synchronize();
  EXPECT_EQ(z[0], 0xBBBBBBBBu);
  a.deallocate(z);
  a.deallocate(y);
  dev->destroy_stream(s1);
  dev->destroy_stream(s2);
}

TEST(AllocatorStreams, RecordStreamDelaysReuseUntilThatStreamArrives) {
  auto dev = small_device();
  CachingAllocator a(*dev, classic_options());
  Stream s1 = dev->create_stream(), s2 = dev->create_stream();
  void* x = a.allocate(MiB, s1);
  void* y = a.allocate(MiB, s1);
  Order order;
  Gate gate;
  gate.hold(*dev, s2, [&] { order.push("s2 uses x"); });
  a.record_stream(x, s2);
  a.deallocate(x);
  EXPECT_EQ(a.stats().active_bytes.all.current, static_cast<std::int64_t>(2 * MiB)) << "x is pending";
  EXPECT_EQ(a.stats().allocated_bytes.all.current, static_cast<std::int64_t>(MiB));
  Snapshot snap = a.snapshot();
  ASSERT_EQ(snap.segments.size(), 1u);
  EXPECT_EQ(snap.segments[0].blocks[0].state, BlockState::active_pending_free);
  // Same stream as the free, but s2 has not reached the free point: a device-side wait.
  void* z = a.allocate(MiB, s1);
  EXPECT_EQ(z, x);
  EXPECT_EQ(a.stats().num_stream_waits, 1);
  dev->launch_host(s1, [&] { order.push("s1 reuses x"); });
  gate.release();
  dev->synchronize();
  EXPECT_EQ(order.seen, (std::vector<std::string>{"s2 uses x", "s1 reuses x"}));
  a.deallocate(z);
  a.deallocate(y);
  dev->destroy_stream(s1);
  dev->destroy_stream(s2);
}

TEST(AllocatorStreams, PendingBlockBecomesFreeWhenEventCompletes) {
  auto dev = small_device();
  CachingAllocator a(*dev, classic_options());
  Stream s1 = dev->create_stream(), s2 = dev->create_stream();
  void* x = a.allocate(MiB, s1);
  void* y = a.allocate(MiB, s1);
  a.record_stream(x, s2);
  a.deallocate(x);
  dev->synchronize(s2);  // s2 passes the free point
  void* z = a.allocate(MiB, s1);
  EXPECT_EQ(z, x);
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.num_stream_waits, 0);
  EXPECT_EQ(st.active_bytes.all.current, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(st.num_device_alloc, 1);
  a.deallocate(z);
  a.deallocate(y);
  dev->destroy_stream(s1);
  dev->destroy_stream(s2);
}

TEST(AllocatorStreams, FreshMemoryOnAnotherStreamNeedsNoWait) {
  auto dev = small_device();
  CachingAllocator a(*dev, classic_options());
  Stream s1 = dev->create_stream(), s2 = dev->create_stream();
  void* x = a.allocate(4096, s1);
  void* y = a.allocate(4096, s2);  // from the never-used rest of the segment
  EXPECT_EQ(addr(y), addr(x) + 4096);
  a.deallocate(x);
  void* z = a.allocate(4096, s2);  // x is s1's; s2 takes never-used memory instead
  EXPECT_NE(z, x);
  EXPECT_EQ(a.stats().num_stream_waits, 0);
  for (void* p : {y, z}) a.deallocate(p);
  dev->destroy_stream(s1);
  dev->destroy_stream(s2);
}

TEST(AllocatorStreams, ExpandableHandsOverInsteadOfMapping) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  ASSERT_EQ(a.segment_mode(), SegmentMode::expandable);
  Stream s1 = dev->create_stream(), s2 = dev->create_stream();
  void* x = a.allocate(8 * MiB, s1);
  a.deallocate(x);
  const auto reserved = a.stats().reserved_bytes.all.current;
  void* z = a.allocate(8 * MiB, s2);
  EXPECT_EQ(z, x);
  EXPECT_EQ(a.stats().num_stream_waits, 1);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, reserved);
  a.deallocate(z);
  dev->synchronize();
  dev->destroy_stream(s1);
  dev->destroy_stream(s2);
}

}  // namespace
}  // namespace stowage
