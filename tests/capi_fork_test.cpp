// The C ABI in a process forked from one that used it (what a DataLoader worker forked from a
// training process is): every allocator and host-pool entry point returns its error value with
// STOWAGE_ERROR_DEVICE and a last error naming fork(), instead of the parent's addresses (which
// crashed the child, or were a private copy of the parent's memory). The parent goes on.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "fork_test_util.hpp"
#include "stowage/stowage.h"

namespace {

// A small device, set before the library reads its configuration.
const bool env_set = [] {
  return setenv("STOWAGE_EMULATED_CAPACITY", "256MiB", 0) == 0 && setenv("STOWAGE_EMULATED_DEVICES", "2", 0) == 0;
}();

constexpr ssize_t kMiB = 1 << 20;

// Each check returns the entry point's result as "refused" (true) or not; the child's status is
// 0, or 10 + the index of the first call that was not refused with STOWAGE_ERROR_DEVICE naming fork().
int refusals(const std::vector<std::function<bool()>>& calls) {
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const bool refused = calls[i]();
    if (!refused || stowage_last_error_code() != STOWAGE_ERROR_DEVICE ||
        std::strstr(stowage_last_error(), "fork()") == nullptr)
      return 10 + static_cast<int>(i);
  }
  return 0;
}

TEST(CApiFork, EveryAllocatorEntryPointIsRefusedInAForkedChild) {
  ASSERT_TRUE(env_set);
  void* keep = stowage_malloc(4096, 0, nullptr);
  ASSERT_NE(keep, nullptr) << stowage_last_error();
  void* cached = stowage_malloc(kMiB, 0, nullptr);
  ASSERT_NE(cached, nullptr) << stowage_last_error();
  stowage_free(cached, kMiB, 0, nullptr);  // in this thread's cache
  void* host = stowage_host_malloc(4096, 0);
  ASSERT_NE(host, nullptr) << stowage_last_error();
  void* host_cached = stowage_host_malloc(4096, 0);
  ASSERT_NE(host_cached, nullptr) << stowage_last_error();
  ASSERT_EQ(stowage_host_free(host_cached, 0), 0);  // its pages stay pinned in the pool

  const int status = stowage::test::in_child([&] {
    char buf[1 << 16];
    return refusals({
        [] { return stowage_malloc(kMiB, 0, nullptr) == nullptr; },  // the cached block
        [] { return stowage_malloc(8192, 0, nullptr) == nullptr; },
        [&] {
          stowage_free(keep, 4096, 0, nullptr);
          return stowage_last_error_code() != STOWAGE_OK;
        },
        [&] { return stowage_record_stream(keep, 0, nullptr) == -1; },
        [&] { return stowage_record_stream(keep, -1, nullptr) == -1; },  // looks for the owner
        [&] { return stowage_block_device(keep) == -1; },
        [] { return stowage_empty_cache(0) == -1; },
        [] { return stowage_empty_cache(-1) == -1; },
        [&] { return stowage_get_stats(0, buf, sizeof buf) == -1; },
        [&] { return stowage_snapshot_json(0, buf, sizeof buf) == -1; },
        [] { return stowage_reset_peak_stats(0) == -1; },
        [] { return stowage_set_memory_cap(0, 0) == -1; },
        [] { return stowage_host_malloc(4096, 0) == nullptr; },  // the pool's cached buffer
        [&] { return stowage_host_free(host, 0) == -1; },
        [&] { return stowage_host_stats(0, buf, sizeof buf) == -1; },
        [] { return stowage_host_release_unused(0) == -1; },
    });
  });
  EXPECT_EQ(status, 0);
  // The parent's allocator serves its cached block again.
  void* again = stowage_malloc(kMiB, 0, nullptr);
  EXPECT_EQ(again, cached);
  stowage_free(again, kMiB, 0, nullptr);
  stowage_free(keep, 4096, 0, nullptr);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_OK) << stowage_last_error();
  EXPECT_EQ(stowage_host_free(host, 0), 0) << stowage_last_error();
}

// A device the parent never used through the C ABI: the child makes no allocator or host pool
// for it (the registries' locks may be held by a parent's thread, the device is the parent's).
TEST(CApiFork, ADeviceTheParentNeverUsedIsRefusedToo) {
  ASSERT_TRUE(env_set);
  // STOWAGE_EMULATED_DEVICES counts emulated devices only; under CUDA the GPUs decide.
  if (stowage_device_count() < 2) GTEST_SKIP() << "needs two devices, there are " << stowage_device_count();
  void* warm = stowage_malloc(4096, 0, nullptr);  // the registries exist, device 1 has nothing
  ASSERT_NE(warm, nullptr) << stowage_last_error();
  const int status = stowage::test::in_child([] {
    char buf[1 << 12];
    return refusals({
        [] { return stowage_malloc(4096, 1, nullptr) == nullptr; },
        [] { return stowage_host_malloc(4096, 1) == nullptr; },
        [&] { return stowage_host_stats(1, buf, sizeof buf) == -1; },
        [] { return stowage_host_release_unused(1) == -1; },
    });
  });
  EXPECT_EQ(status, 0);
  stowage_free(warm, 4096, 0, nullptr);
  // The parent uses device 1 as usual.
  void* p = stowage_malloc(4096, 1, nullptr);
  EXPECT_NE(p, nullptr) << stowage_last_error();
  stowage_free(p, 4096, 1, nullptr);
}

// A parent that opened the devices but made no allocator (it asked for the device count and
// used a host pool): the child's stowage_empty_cache(-1) is refused as each device's own call is,
// not a success over no allocators. And the child's first failure reaches stderr though the
// parent's first failure already did: the line is said once per process.
TEST(CApiFork, EmptyCacheOfEveryDeviceIsRefusedAndTheChildsFirstErrorIsSaid) {
  ASSERT_TRUE(env_set);
  ASSERT_GE(stowage_device_count(), 1);
  void* host = stowage_host_malloc(4096, 0);
  ASSERT_NE(host, nullptr) << stowage_last_error();
  EXPECT_EQ(stowage_malloc(4096, 1000, nullptr), nullptr);  // the parent's first failure, said on stderr
  EXPECT_NE(stowage_last_error_code(), STOWAGE_OK);
  const int status = stowage::test::in_child([] {
    std::FILE* said = std::tmpfile();
    if (said == nullptr || dup2(fileno(said), 2) < 0) return 20;
    if (stowage_empty_cache(-1) != -1 || stowage_last_error_code() != STOWAGE_ERROR_DEVICE) return 10;
    if (std::strstr(stowage_last_error(), "fork()") == nullptr) return 11;
    std::fflush(stderr);
    std::rewind(said);
    char line[1024] = {};
    if (std::fgets(line, sizeof line, said) == nullptr) return 12;
    return std::strstr(line, "fork()") != nullptr && std::strstr(line, "first error") != nullptr ? 0 : 13;
  });
  EXPECT_EQ(status, 0);
  EXPECT_EQ(stowage_empty_cache(-1), 0) << stowage_last_error();  // the parent's goes on
  EXPECT_EQ(stowage_host_free(host, 0), 0) << stowage_last_error();
}

}  // namespace
