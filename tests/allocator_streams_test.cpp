// Stream-ordered reuse: same stream at once, other streams only after a device-side wait on the
// point where the block was freed, record_stream, and pending blocks handed out instead of growing.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
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

TEST(AllocatorStreams, APendingBlockWhoseStreamsArrivedIsReusedBeforeAnotherIsSplit) {
  auto dev = small_device();
  CachingAllocator a(*dev, classic_options());
  Stream s1 = dev->create_stream(), s2 = dev->create_stream();
  void* x = a.allocate(4096, s1);  // its 2 MiB segment keeps a free remainder that would also fit
  a.record_stream(x, s2);
  a.deallocate(x);
  dev->synchronize(s2);
  void* z = a.allocate(4096, s1);  // as PyTorch: finished frees are completed before the search
  EXPECT_EQ(z, x);
  const AllocatorStats st = a.stats();
  EXPECT_EQ(st.active_bytes.all.current, 4096);
  EXPECT_EQ(st.allocation.all.current, 1);
  a.deallocate(z);
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

// Classic and expandable segments, each with and without the threads' caches.
std::vector<AllocatorOptions> every_configuration() {
  std::vector<AllocatorOptions> out;
  for (SegmentMode mode : {SegmentMode::classic, SegmentMode::expandable}) {
    AllocatorOptions o;
    o.segments = mode;
    out.push_back(o);
    out.push_back(without_thread_caches(o));
  }
  return out;
}

std::string describe(const AllocatorOptions& o) {
  return std::string(o.segments == SegmentMode::classic ? "classic" : "expandable") +
         (o.thread_cache_bytes > 0 ? ", thread caches" : ", no thread caches");
}

// A stream is destroyed after blocks were freed on it (kept in the thread's cache, or in the
// pools): allocating on it is refused as for any stream that is not real, changing nothing.
TEST(AllocatorStreams, AllocationOnADestroyedStreamIsRefusedAndChangesNothing) {
  for (const AllocatorOptions& o : every_configuration()) {
    SCOPED_TRACE(describe(o));
    auto dev = small_device();
    CachingAllocator a(*dev, o);
    const Stream s = dev->create_stream();
    const std::size_t sizes[] = {64 * KiB, 3 * MiB};
    for (std::size_t bytes : sizes) a.deallocate(a.allocate(bytes, s));
    dev->destroy_stream(s);
    const std::string before = to_json(a.stats());
    for (std::size_t bytes : sizes) EXPECT_THROW(a.allocate(bytes, s), InvalidArgument);
    EXPECT_EQ(to_json(a.stats()), before);
    // The memory is still the allocator's to hand out on live streams.
    for (std::size_t bytes : sizes) a.deallocate(a.allocate(bytes));
    EXPECT_EQ(a.stats().allocated_bytes.all.current, 0);
  }
}

// destroy_stream returns once the stream's work has finished, so a block freed on it needs no
// ordering after it: another stream takes it (no wait, no growth) instead of failing to record an
// event on a stream that is gone.
TEST(AllocatorStreams, ABlockOfADestroyedStreamServesOtherStreams) {
  for (const AllocatorOptions& o : every_configuration()) {
    SCOPED_TRACE(describe(o));
    auto dev = small_device();
    CachingAllocator a(*dev, o);
    const Stream s = dev->create_stream();
    auto* x = static_cast<std::uint32_t*>(a.allocate(MiB, s));
    void* y = a.allocate(MiB, s);  // the 2 MiB segment (or mapping) is full
    dev->launch_host(s, [x] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      x[0] = 0xAAAAAAAA;  // s still writes x after the free below
    });
    a.deallocate(x);
    dev->destroy_stream(s);  // waits for the write
    const AllocatorStats before = a.stats();
    auto* z = static_cast<std::uint32_t*>(a.allocate(MiB));  // the default stream
    EXPECT_EQ(z, x) << "the block freed on the destroyed stream should be reused";
    const AllocatorStats after = a.stats();
    EXPECT_EQ(after.reserved_bytes.all.current, before.reserved_bytes.all.current);
    EXPECT_EQ(after.num_device_alloc, before.num_device_alloc);
    EXPECT_EQ(after.num_stream_waits, before.num_stream_waits) << "nothing is left to wait for";
    EXPECT_EQ(x[0], 0xAAAAAAAAu);
    z[0] = 0xBBBBBBBB;
    dev->synchronize();
    EXPECT_EQ(z[0], 0xBBBBBBBBu);
    // y, allocated on the destroyed stream, frees and serves the default stream too.
    a.deallocate(y);
    void* w = a.allocate(MiB);
    EXPECT_EQ(w, y);
    EXPECT_EQ(a.stats().reserved_bytes.all.current, before.reserved_bytes.all.current);
    a.deallocate(w);
    a.deallocate(z);
    a.empty_cache();
    EXPECT_EQ(a.stats().reserved_bytes.all.current, 0);
  }
}

// A block also used on a stream that is destroyed before the free: that stream's work has
// finished, so the free records nothing on it (and does not fail), and the block is reused.
TEST(AllocatorStreams, AFreeIgnoresAUseOnADestroyedStream) {
  for (const AllocatorOptions& o : every_configuration()) {
    SCOPED_TRACE(describe(o));
    auto dev = small_device();
    CachingAllocator a(*dev, o);
    const Stream user = dev->create_stream();
    void* x = a.allocate(MiB);
    void* y = a.allocate(MiB);
    a.record_stream(x, user);
    dev->destroy_stream(user);
    EXPECT_NO_THROW(a.deallocate(x));
    const AllocatorStats st = a.stats();
    EXPECT_EQ(st.allocated_bytes.all.current, static_cast<std::int64_t>(a.block_size(y)));
    EXPECT_EQ(st.active_bytes.all.current, st.allocated_bytes.all.current) << "nothing left pending";
    EXPECT_EQ(a.allocate(MiB), x);
    a.deallocate(x);
    a.deallocate(y);
  }
}

}  // namespace
}  // namespace stowage
