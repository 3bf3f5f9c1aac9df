// The caching allocator (and the adaptors over it) in a process forked from the one that made
// it: every entry point refuses with a DeviceError naming fork(), before it takes a lock or hands
// out an address. A child used to get the parent's addresses from its thread cache and the pools
// (then crashed on them, or wrote a private copy), and hung for ever when a parent's thread held
// the allocator's lock at the fork. Destroying the allocator works there; the parent goes on.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "allocator_test_util.hpp"
#include "fork_test_util.hpp"
#include "stowage/device_resource.hpp"
#include "stowage/error.hpp"
#include "stowage/event_log.hpp"
#include "stowage/fault_injection.hpp"
#include "stowage/limiting_resource.hpp"
#include "stowage/logging_resource.hpp"
#include "stowage/statistics_resource.hpp"

namespace stowage {
namespace {

using test::in_child;
using test::KiB;
using test::MiB;
using test::refusals;

class AllocatorFork : public ::testing::TestWithParam<SegmentMode> {};

TEST_P(AllocatorFork, EveryEntryPointIsRefusedInAForkedChildAndDestroyingWorks) {
  auto dev = test::small_device();
  AllocatorOptions o;
  o.segments = GetParam();
  auto a = std::make_unique<CachingAllocator>(*dev, o);
  const Stream s = dev->create_stream();
  void* keep = a->allocate(4 * KiB);  // live: its segment stays in the parent
  void* cached = a->allocate(MiB);
  a->deallocate(cached);  // in this thread's cache
  void* pooled = a->allocate(8 * MiB);
  a->deallocate(pooled);  // in the large pool
  const AllocatorStats before = a->stats();

  const int status = in_child([&] {
    const int code = refusals({
        [&] { a->allocate(MiB); },      // the thread cache's block
        [&] { a->allocate(8 * MiB); },  // the pool's
        [&] { a->allocate(8 * KiB); },  // new
        [&] { a->deallocate(keep); },
        [&] { a->deallocate(keep, 4 * KiB); },
        [&] { a->record_stream(keep, s); },
        [&] { a->block_size(keep); },
        [&] { a->owns(keep); },
        [&] { a->empty_cache(); },
        [&] { a->stats(); },
        [&] { a->snapshot(); },
        [&] { a->reset_peak_stats(); },
        [&] { a->set_memory_cap(0); },
        [&] { a->set_memory_fraction(0.5); },
        [&] { a->memory_cap(); },
    });
    if (code != 0) return code;
    a.reset();  // asks the device nothing (it refuses here) and takes no lock
    return 0;
  });
  EXPECT_EQ(status, 0);
  // The parent's allocator is as it was: its thread cache serves the same block again.
  EXPECT_EQ(a->stats().allocated_bytes.all.current, before.allocated_bytes.all.current);
  void* again = a->allocate(MiB);
  EXPECT_EQ(again, cached);
  a->deallocate(again);
  a->deallocate(keep);
  a->empty_cache();
  EXPECT_EQ(a->stats().reserved_bytes.all.current, 0);
  a.reset();
  dev->destroy_stream(s);
}

INSTANTIATE_TEST_SUITE_P(Modes, AllocatorFork, ::testing::Values(SegmentMode::classic, SegmentMode::expandable),
                         [](const auto& info) {
                           return info.param == SegmentMode::classic ? "classic" : "expandable";
                         });

// An emulated device whose allocate() waits, once asked for `blocking_bytes` or more, until
// released: the allocator's caller is then inside its lock (and every thread cache's).
class HoldingDevice : public FaultInjectingDevice {
 public:
  explicit HoldingDevice(std::size_t blocking_bytes)
      : FaultInjectingDevice(test::small_device(), FaultPlan{}), blocking_(blocking_bytes) {}
  void* allocate(std::size_t bytes) override {
    if (bytes >= blocking_) {
      std::unique_lock lock(mu_);
      inside_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_; });
    }
    return FaultInjectingDevice::allocate(bytes);
  }
  void wait_inside() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return inside_; });
  }
  void release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::size_t blocking_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool inside_ = false, released_ = false;
};

TEST(AllocatorForkLocks, AChildForkedWhileAnotherThreadHeldTheLocksIsRefusedNotHung) {
  HoldingDevice dev(64 * MiB);
  auto a = std::make_unique<CachingAllocator>(dev, test::classic_options());
  void* keep = a->allocate(4 * KiB);
  void* cached = a->allocate(MiB);
  a->deallocate(cached);  // this thread has a cache, whose lock the grower holds below
  void* big = nullptr;
  std::thread grower([&] { big = a->allocate(64 * MiB); });  // grows a segment inside the locks
  dev.wait_inside();

  const int status = in_child(
      [&] {
        const int code = refusals({
            [&] { a->allocate(MiB); },  // this thread's cache: its lock is held
            [&] { a->allocate(8 * KiB); },
            [&] { a->deallocate(keep); },
            [&] { a->stats(); },
            [&] { a->empty_cache(); },
        });
        if (code != 0) return code;
        a.reset();
        return 0;
      },
      std::chrono::seconds(10));
  EXPECT_EQ(status, 0);
  dev.release();
  grower.join();
  ASSERT_NE(big, nullptr);
  a->deallocate(big);
  a->deallocate(keep);
  a->empty_cache();
  EXPECT_EQ(a->stats().reserved_bytes.all.current, 0);
}

TEST(AllocatorForkAdaptors, AdaptorsOverTheAllocatorAreRefusedToo) {
  auto dev = test::small_device();
  auto a = std::make_shared<CachingAllocator>(*dev);
  const std::string log_path =
      (std::filesystem::temp_directory_path() / ("stowage_fork_" + std::to_string(::getpid()) + ".csv")).string();
  auto stats = std::make_shared<StatisticsResource>(a);
  auto limited = std::make_shared<LimitingResource>(a, 64 * MiB);
  auto logged = std::make_shared<LoggingResource>(a, std::make_shared<EventLog>(log_path));
  DeviceResource direct(*dev);
  void* from_stats = stats->allocate(MiB);
  void* from_direct = direct.allocate(4 * KiB);

  const int status = in_child([&] {
    return refusals({
        [&] { stats->allocate(MiB); },
        [&] { stats->deallocate(from_stats); },
        [&] { limited->allocate(MiB); },
        [&] { logged->allocate(MiB); },
        [&] { direct.allocate(4 * KiB); },
        [&] { direct.deallocate(from_direct); },
    });
  });
  EXPECT_EQ(status, 0);
  stats->deallocate(from_stats);
  direct.deallocate(from_direct);
  std::filesystem::remove(log_path);
}

TEST(AllocatorForkAdaptors, AnAllocatorMadeInTheChildWorksThere) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer cannot start threads after a multi-threaded fork() (it exits the child with 66)";
#endif
  auto parent = test::small_device();
  CachingAllocator parents(*parent);
  parents.deallocate(parents.allocate(MiB));  // this thread's cache holds the parent's block
  test::wait_for_other_threads_to_sleep();    // the parent device's worker has started
  const int status = in_child([] {
    auto dev = test::small_device();
    CachingAllocator a(*dev);
    void* p = a.allocate(MiB);
    a.deallocate(p);
    void* q = a.allocate(MiB);  // through this thread's new cache
    const int code = q == p && a.stats().allocated_bytes.all.current == static_cast<std::int64_t>(MiB) ? 0 : 1;
    a.deallocate(q);
    return code;
  });
  EXPECT_EQ(status, 0);
}

}  // namespace
}  // namespace stowage
