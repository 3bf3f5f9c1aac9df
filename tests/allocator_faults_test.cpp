// The caching allocator on a device that refuses every Nth allocation or mapping: a refusal
// frees the cache and retries once; a second refusal is an OutOfMemory with the full report.
// Either way the books add up, live blocks keep their bytes, and the device gets everything back.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "allocator_test_util.hpp"
#include "stowage/fault_injection.hpp"

namespace stowage {
namespace {

using namespace stowage::test;
using ::testing::HasSubstr;

std::uint64_t splitmix(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The bytes a block written with `seed` holds (the emulated device's memory is host memory).
void write_pattern(void* p, std::size_t n, std::uint64_t seed) {
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; i += 8) {
    const std::uint64_t v = splitmix(seed);
    std::memcpy(b + i, &v, std::min<std::size_t>(8, n - i));
  }
}

bool has_pattern(const void* p, std::size_t n, std::uint64_t seed) {
  std::vector<unsigned char> want(n);
  write_pattern(want.data(), n, seed);
  return std::memcmp(p, want.data(), n) == 0;
}

struct Live {
  void* ptr;
  std::size_t bytes;
  std::uint64_t seed;
};

class AllocatorFaults : public ::testing::TestWithParam<SegmentMode> {
 protected:
  void SetUp() override {
    device_ = std::make_unique<FaultInjectingDevice>(small_device(256 * MiB), FaultPlan{});
    AllocatorOptions o;
    o.segments = GetParam();
    alloc_ = std::make_unique<CachingAllocator>(*device_, o);
    ASSERT_EQ(alloc_->segment_mode(), GetParam());
  }

  void TearDown() override {
    device_->set_plan({});
    for (const Live& l : live_) alloc_->deallocate(l.ptr);
    live_.clear();
    alloc_.reset();
    // Every byte, mapping and reservation is back with the device.
    EXPECT_EQ(device_->free_memory(), device_->capacity());
    const DeviceCounters c = device_->counters();
    EXPECT_EQ(c.raw_allocated, 0u);
    EXPECT_EQ(c.physical_allocated, 0u);
    EXPECT_EQ(c.reserved_address, 0u);
  }

  void* take(std::size_t bytes, std::uint64_t seed) {
    void* p = alloc_->allocate(bytes);
    write_pattern(p, bytes, seed);
    live_.push_back({p, bytes, seed});
    return p;
  }

  void give(std::size_t index) {
    const Live l = live_[index];
    EXPECT_TRUE(has_pattern(l.ptr, l.bytes, l.seed)) << "block of " << l.bytes << " bytes changed";
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(index));
    alloc_->deallocate(l.ptr);
  }

  // Statistics agree with the live blocks, the device agrees with the statistics, and every
  // live block still holds what was written into it.
  void check_books() {
    device_->synchronize();
    const AllocatorStats s = alloc_->stats();
    std::int64_t block_bytes = 0, requested = 0;
    for (const Live& l : live_) {
      block_bytes += static_cast<std::int64_t>(alloc_->block_size(l.ptr));
      requested += static_cast<std::int64_t>(l.bytes);
      EXPECT_TRUE(has_pattern(l.ptr, l.bytes, l.seed)) << "block of " << l.bytes << " bytes changed";
    }
    EXPECT_EQ(s.allocated_bytes.all.current, block_bytes);
    EXPECT_EQ(s.active_bytes.all.current, block_bytes);  // one stream: nothing pending
    EXPECT_EQ(s.requested_bytes.all.current, requested);
    EXPECT_EQ(s.allocation.all.current, static_cast<std::int64_t>(live_.size()));
    EXPECT_GE(s.reserved_bytes.all.current, s.allocated_bytes.all.current);
    EXPECT_EQ(static_cast<std::int64_t>(device_->capacity() - device_->free_memory()), s.reserved_bytes.all.current)
        << "the device holds memory the allocator does not account for";
  }

  std::unique_ptr<FaultInjectingDevice> device_;
  std::unique_ptr<CachingAllocator> alloc_;
  std::vector<Live> live_;
};

TEST_P(AllocatorFaults, RefusedTwiceIsOutOfMemoryWithTheFullReportAndNothingChanges) {
  take(300 * KiB, 1);
  take(5 * MiB, 2);
  take(12 * MiB, 3);
  alloc_->deallocate(alloc_->allocate(30 * MiB));  // cached: the retry must give it back
  check_books();
  const AllocatorStats before = alloc_->stats();

  device_->set_plan({.allocation_every = 1, .map_every = 1});
  std::string message;
  try {
    alloc_->allocate(40 * MiB);
    ADD_FAILURE() << "an allocation needing growth succeeded with every device call refused";
  } catch (const OutOfMemory& e) {
    message = e.what();
  }
  EXPECT_THAT(message, HasSubstr("stowage: out of memory on device 0"));
  EXPECT_THAT(message, HasSubstr("tried to allocate 40.00 MiB"));
  EXPECT_THAT(message, HasSubstr("capacity 256.00 MiB"));
  EXPECT_THAT(message, HasSubstr("reserved but unallocated"));
  EXPECT_THAT(message, HasSubstr("largest free block"));
  EXPECT_THAT(message, HasSubstr("cause: injected"));  // the device's own reason is kept
  EXPECT_THAT(message, HasSubstr("Try:"));
  // Both attempts reached the device: the first one, then the retry after the cache went back.
  const FaultCounts injected = device_->injected();
  EXPECT_EQ(injected.allocation + injected.map, 2u);

  const AllocatorStats after = alloc_->stats();
  EXPECT_EQ(after.num_alloc_retries, before.num_alloc_retries + 1);
  EXPECT_EQ(after.num_ooms, before.num_ooms + 1);
  EXPECT_EQ(after.allocated_bytes.all.current, before.allocated_bytes.all.current);
  EXPECT_LE(after.reserved_bytes.all.current + static_cast<std::int64_t>(30 * MiB), before.reserved_bytes.all.current)
      << "the cached 30 MiB block was not given back before the retry";
  check_books();

  device_->set_plan({});  // the device works again: so does the allocator
  take(40 * MiB, 4);
  take(700 * KiB, 5);
  check_books();
  give(0);
  give(0);
  check_books();
}

TEST_P(AllocatorFaults, ASingleRefusalIsRetriedAndSucceeds) {
  // Each growth here needs one device allocation (a classic segment, or one 2 MiB granule), so
  // with every 2nd refused the retry always gets through: no request fails.
  device_->set_plan({.allocation_every = 2});
  std::uint64_t rng = 7;
  for (int op = 0; op < 400; ++op) {
    const std::uint64_t r = splitmix(rng);
    if (live_.size() < 40 && (r % 3 != 0 || live_.empty())) {
      const std::size_t bytes = 1 + static_cast<std::size_t>(r >> 8) % (2 * MiB - 1);
      ASSERT_NO_THROW(take(bytes, r)) << "op " << op;
    } else {
      give(static_cast<std::size_t>(r >> 16) % live_.size());
    }
    if (op % 50 == 0) alloc_->empty_cache();  // more growth, more refusals
  }
  const AllocatorStats s = alloc_->stats();
  const FaultCounts injected = device_->injected();
  EXPECT_GE(injected.allocation, 10u);
  EXPECT_EQ(s.num_alloc_retries, static_cast<std::int64_t>(injected.allocation));
  EXPECT_EQ(s.num_ooms, 0);
  check_books();
}

// STOWAGE_FAULTS=map=2: every second mapping call refused. A growth makes several (one per
// granule, then the access call), so without a second try each growth met a refusal and every
// allocation that needed one failed; a refused mapping is tried once more.
TEST_P(AllocatorFaults, EverySecondMappingRefusedStillAllocates) {
  device_->set_plan({.map_every = 2});
  for (int i = 0; i < 20; ++i) {
    ASSERT_NO_THROW(take((1 + i % 5) * 3 * MiB, static_cast<std::uint64_t>(i))) << "allocation " << i;
    if (i % 4 == 3) {
      while (!live_.empty()) give(0);
      alloc_->empty_cache();  // more growth, more mappings
    }
  }
  const FaultCounts injected = device_->injected();
  if (GetParam() == SegmentMode::expandable) EXPECT_GE(injected.map, 10u);
  EXPECT_EQ(alloc_->stats().num_ooms, 0);
  check_books();
}

TEST_P(AllocatorFaults, MixedFaultsSurfaceOnlyOutOfMemoryAndKeepTheBooks) {
  // A refused mapping is tried again at once; a growth of 3+ granules with every 3rd physical
  // chunk refused meets a refusal on the allocator's retry too, so out-of-memory happens.
  device_->set_plan({.allocation_every = 3, .map_every = 7});
  std::uint64_t rng = 11;
  std::int64_t ooms = 0, successes = 0;
  for (int op = 0; op < 300; ++op) {
    const std::uint64_t r = splitmix(rng);
    if (live_.size() < 12 && (r % 3 != 0 || live_.empty())) {
      // Up to 8 MiB: growth of up to 4 granules, each a create_physical and a map.
      const std::size_t bytes = 1 + static_cast<std::size_t>(r >> 8) % (8 * MiB);
      try {
        take(bytes, r);
        ++successes;
      } catch (const OutOfMemory& e) {
        ++ooms;
        EXPECT_THAT(e.what(), HasSubstr("cause: injected")) << "op " << op;  // never a real shortage
      } catch (const std::exception& e) {
        FAIL() << "op " << op << ": a refused device call surfaced as something else than OutOfMemory: " << e.what();
      }
    } else {
      give(static_cast<std::size_t>(r >> 16) % live_.size());
    }
    if (op % 20 == 0) check_books();
    if (op % 37 == 0) alloc_->empty_cache();
  }
  const AllocatorStats s = alloc_->stats();
  EXPECT_GT(successes, 0);
  EXPECT_EQ(s.num_ooms, ooms);
  EXPECT_GE(s.num_alloc_retries, ooms);  // every failure was retried first
  const FaultCounts injected = device_->injected();
  EXPECT_GT(injected.allocation + injected.map, 0u);
  if (GetParam() == SegmentMode::expandable) EXPECT_GT(ooms, 0);  // a retry can meet a 2nd refusal
  check_books();

  device_->set_plan({});
  take(64 * MiB, 99);
  check_books();
}

// The allocator records an event when a block used on other streams is freed, and when it makes
// a stream wait for a block last used on another. A refused record is a DeviceError that changes
// nothing: the block stays live (or free where it was), and the same call works afterwards.
TEST_P(AllocatorFaults, RefusedEventRecordChangesNothing) {
  const Stream s2 = device_->create_stream();
  void* p = take(1 * MiB, 7);
  alloc_->record_stream(p, s2);
  check_books();
  const AllocatorStats before = alloc_->stats();

  device_->set_plan({.record_every = 1});
  EXPECT_THROW(alloc_->deallocate(p), DeviceError);
  device_->set_plan({});
  check_books();  // p is still live, with its bytes
  EXPECT_EQ(alloc_->stats().allocated_bytes.all.current, before.allocated_bytes.all.current);
  give(0);  // and frees now
  device_->synchronize();

  // A free block of the default stream's, taken for s2 behind a wait. (6 MiB: larger than a
  // thread cache keeps, so it goes back to its pool and merges at once.)
  void* q = alloc_->allocate(6 * MiB);
  alloc_->deallocate(q);
  const std::int64_t reserved = alloc_->stats().reserved_bytes.all.current;
  const std::int64_t waits = alloc_->stats().num_stream_waits;
  device_->set_plan({.record_every = 1});
  EXPECT_THROW(alloc_->allocate(6 * MiB, s2), DeviceError);
  device_->set_plan({});
  EXPECT_EQ(alloc_->stats().allocated_bytes.all.current, 0);
  EXPECT_EQ(alloc_->stats().reserved_bytes.all.current, reserved);
  EXPECT_EQ(alloc_->stats().num_stream_waits, waits);
  void* r = alloc_->allocate(6 * MiB, s2);  // the same block, now behind a wait
  EXPECT_EQ(r, q);
  EXPECT_EQ(alloc_->stats().num_stream_waits, waits + 1);
  alloc_->deallocate(r);
  device_->synchronize();
  alloc_->empty_cache();
  device_->destroy_stream(s2);
}

INSTANTIATE_TEST_SUITE_P(Segments, AllocatorFaults, ::testing::Values(SegmentMode::classic, SegmentMode::expandable),
                         [](const auto& info) {
                           return std::string(info.param == SegmentMode::classic ? "Classic" : "Expandable");
                         });

}  // namespace
}  // namespace stowage
