// Memory caps, out-of-memory reports, and bad input that must leave the allocator unchanged.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "allocator_test_util.hpp"

namespace stowage {
namespace {

using namespace test;
using ::testing::HasSubstr;

std::string oom_message(CachingAllocator& a, std::size_t bytes) {
  try {
    a.allocate(bytes);
  } catch (const OutOfMemory& e) {
    return e.what();
  }
  ADD_FAILURE() << "allocate(" << bytes << ") did not throw OutOfMemory";
  return {};
}

TEST(AllocatorErrors, CapRefusesWithAFullReport) {
  auto dev = small_device();
  AllocatorOptions o;
  o.memory_cap_bytes = 64 * MiB;
  CachingAllocator a(*dev, o);
  EXPECT_EQ(a.memory_cap(), 64 * MiB);
  void* x = a.allocate(40 * MiB);
  void* s = a.allocate(3000);
  const std::string msg = oom_message(a, 30 * MiB);
  EXPECT_THAT(msg, HasSubstr("tried to allocate 30.00 MiB"));
  EXPECT_THAT(msg, HasSubstr("capacity 256.00 MiB"));
  EXPECT_THAT(msg, HasSubstr("memory cap 64.00 MiB"));
  EXPECT_THAT(msg, HasSubstr("40.00 MiB allocated"));
  EXPECT_THAT(msg, HasSubstr("reserved but unallocated"));
  EXPECT_THAT(msg, HasSubstr("largest free block"));
  EXPECT_THAT(msg, HasSubstr("memory cap (memory_cap_mb)"));
  EXPECT_THAT(msg, HasSubstr("empty_cache"));
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.num_ooms, 1);
  EXPECT_EQ(st.num_alloc_retries, 1);
  EXPECT_EQ(st.allocated_bytes.all.current, static_cast<std::int64_t>(40 * MiB + 3072));
  void* y = a.allocate(20 * MiB);  // still fits under the cap
  EXPECT_NE(y, nullptr);
  a.set_memory_cap(0);
  void* z = a.allocate(30 * MiB);  // no cap now
  for (void* p : {x, s, y, z}) a.deallocate(p);
}

TEST(AllocatorErrors, ClassicSuggestsExpandableSegments) {
  auto dev = small_device();
  AllocatorOptions o = classic_options();
  o.memory_cap_fraction = 0.25;
  CachingAllocator a(*dev, o);
  EXPECT_EQ(a.memory_cap(), 64 * MiB);
  void* x = a.allocate(50 * MiB);
  const std::string msg = oom_message(a, 20 * MiB);
  EXPECT_THAT(msg, HasSubstr("expandable_segments:True"));
  a.deallocate(x);
}

TEST(AllocatorErrors, APositiveFractionCapsAtOneByteAtLeast) {
  auto dev = small_device();
  AllocatorOptions o;
  o.memory_cap_fraction = 1e-12;  // 256 MiB x 1e-12 rounds down to 0 bytes, which would mean no cap
  CachingAllocator a(*dev, o);
  EXPECT_EQ(a.memory_cap(), 1u);
  EXPECT_THROW(a.allocate(512), OutOfMemory);
  a.set_memory_fraction(0.5);
  EXPECT_EQ(a.memory_cap(), 128 * MiB);
  a.set_memory_fraction(1e-12);
  EXPECT_EQ(a.memory_cap(), 1u);
  EXPECT_THROW(a.set_memory_fraction(-0.5), InvalidArgument);
  EXPECT_THROW(a.set_memory_fraction(1.5), InvalidArgument);
  EXPECT_EQ(a.memory_cap(), 1u);  // a refused fraction changes nothing
  // PyTorch's range [0, 1]: 1 is no cap, 0 a cap no reservation fits.
  a.set_memory_fraction(1.0);
  EXPECT_EQ(a.memory_cap(), 0u);
  void* p = a.allocate(512);
  a.deallocate(p);
  a.empty_cache();
  a.set_memory_fraction(0.0);
  EXPECT_EQ(a.memory_cap(), 1u);
  EXPECT_THROW(a.allocate(512), OutOfMemory);
}

TEST(AllocatorErrors, RetryAfterFreeingTheCache) {
  auto dev = small_device();
  AllocatorOptions o = classic_options();
  o.memory_cap_bytes = 64 * MiB;
  CachingAllocator a(*dev, o);
  a.deallocate(a.allocate(40 * MiB));  // cached 40 MiB segment
  void* y = a.allocate(50 * MiB);      // 40 + 50 > 64: cache freed, retried
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.num_alloc_retries, 1);
  EXPECT_EQ(st.num_ooms, 0);
  EXPECT_EQ(st.num_device_free, 1);
  EXPECT_EQ(st.reserved_bytes.all.current, static_cast<std::int64_t>(50 * MiB));
  a.deallocate(y);
}

TEST(AllocatorErrors, DeviceRefusalIsOutOfMemory) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  void* x = a.allocate(200 * MiB);
  const std::string msg = oom_message(a, 100 * MiB);
  EXPECT_THAT(msg, HasSubstr("capacity 256.00 MiB"));
  EXPECT_THAT(msg, HasSubstr("200.00 MiB allocated"));
  EXPECT_EQ(a.stats().num_ooms, 1);
  a.deallocate(x);
  void* y = a.allocate(100 * MiB);  // fits once x is gone
  a.deallocate(y);
}

TEST(AllocatorErrors, BadInputLeavesStateUnchanged) {
  auto dev = small_device();
  CachingAllocator a(*dev, without_thread_caches());  // ends on where a merged block lands
  void* x = a.allocate(1000);
  void* y = a.allocate(5 * MiB);
  void* freed = a.allocate(4096);
  a.deallocate(freed);
  const std::string before = to_json(a.stats());
  int on_stack = 0;
  EXPECT_THROW(a.deallocate(&on_stack), InvalidArgument);
  try {
    a.deallocate(freed);
    ADD_FAILURE() << "double free not detected";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("double free"));
  }
  EXPECT_THROW(a.deallocate(static_cast<char*>(y) + 512), InvalidArgument);  // inside a block
  EXPECT_THROW(a.deallocate(x, 999), InvalidArgument);                       // wrong size
  EXPECT_THROW(a.record_stream(&on_stack, kDefaultStream), InvalidArgument);
  EXPECT_THROW(a.block_size(&on_stack), InvalidArgument);
  EXPECT_FALSE(a.owns(&on_stack));
  EXPECT_FALSE(a.owns(freed));
  EXPECT_TRUE(a.owns(x));
  EXPECT_EQ(to_json(a.stats()), before);
  // Still works: the right size (requested or rounded) is accepted.
  a.deallocate(x, 1000);
  a.deallocate(y, 5 * MiB);
  void* z = a.allocate(4096);
  EXPECT_EQ(z, x);  // x, the freed block and the rest merged back into one
  a.deallocate(z);
  EXPECT_EQ(a.stats().allocated_bytes.all.current, 0);
}

TEST(AllocatorErrors, AStreamThatIsNotRealIsRefusedAndChangesNothing) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  const Stream destroyed = dev->create_stream();
  dev->destroy_stream(destroyed);
  const Stream never{0xdead0};
  void* x = a.allocate(4096);
  const std::string before = to_json(a.stats());
  for (Stream bad : {destroyed, never}) {
    EXPECT_THROW(a.allocate(8192, bad), InvalidArgument);
    EXPECT_THROW(a.record_stream(x, bad), InvalidArgument);
  }
  EXPECT_EQ(to_json(a.stats()), before);
  // The block carries no bad stream: it frees and comes back at once.
  a.deallocate(x);
  EXPECT_EQ(a.allocate(4096), x);
  a.deallocate(x);
  // A live stream is still accepted for both.
  const Stream live = dev->create_stream();
  void* y = a.allocate(4096, live);
  a.record_stream(y, kDefaultStream);
  a.deallocate(y);
  dev->synchronize();
  EXPECT_EQ(a.stats().allocated_bytes.all.current, 0);
  a.empty_cache();
  dev->destroy_stream(live);
}

TEST(AllocatorErrors, LargerThanCapacityFailsAtOnce) {
  auto dev = small_device();
  AllocatorOptions o;
  o.trace_entries = 8;
  CachingAllocator a(*dev, o);
  void* x = a.allocate(MiB);
  a.deallocate(x);
  EXPECT_THROW(a.allocate(300 * MiB), OutOfMemory);
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.num_ooms, 1);
  EXPECT_EQ(st.num_alloc_retries, 0);
  EXPECT_EQ(st.reserved_bytes.all.current, static_cast<std::int64_t>(2 * MiB));  // cache kept
  Snapshot s = a.snapshot();
  ASSERT_FALSE(s.trace.empty());
  EXPECT_EQ(s.trace.back().action, TraceAction::oom);
  EXPECT_EQ(s.trace.back().size, 300 * MiB);
}

// One rule for sizes: any byte count the allocator cannot have is OutOfMemory, however large,
// as PyTorch's allocator raises OutOfMemoryError for any size. Past 2^60 the request is refused
// before rounding (which would overflow); it used to be an InvalidArgument there ("larger than
// any device") and an OutOfMemory just below. Both sides now read the same, count an OOM, and
// change nothing else.
TEST(AllocatorErrors, HugeSizesAreOutOfMemoryOnBothSidesOfTheRoundingLimit) {
  auto dev = small_device();
  AllocatorOptions o;
  o.trace_entries = 16;
  CachingAllocator a(*dev, o);
  void* x = a.allocate(4096);
  const AllocatorStats before = a.stats();
  constexpr std::size_t limit = std::size_t{1} << 60;  // allocator/size_classes.hpp: kMaxRequest
  const std::size_t sizes[] = {256 * MiB + 1,
                               std::size_t{1} << 48,
                               limit - 1,
                               limit,
                               limit + 1,
                               std::size_t{1} << 62,
                               std::size_t{1} << 63,
                               std::numeric_limits<std::size_t>::max()};
  std::int64_t ooms = 0;
  for (std::size_t bytes : sizes) {
    const std::string msg = oom_message(a, bytes);
    EXPECT_THAT(msg, HasSubstr("out of memory on device 0"));
    EXPECT_THAT(msg, HasSubstr(std::to_string(bytes) + " bytes"));
    EXPECT_THAT(msg, HasSubstr("larger than the device capacity or the memory cap"));
    EXPECT_EQ(a.stats().num_ooms, ++ooms) << bytes;
  }
  AllocatorStats after = a.stats();
  after.num_ooms = before.num_ooms;
  EXPECT_EQ(to_json(after), to_json(before));
  EXPECT_EQ(a.snapshot().trace.back().action, TraceAction::oom);
  // A bad stream is still the caller's mistake first, whatever the size.
  EXPECT_THROW(a.allocate(std::size_t{1} << 62, Stream{0xdead0}), InvalidArgument);
  a.deallocate(x);
}

}  // namespace
}  // namespace stowage
