// The C ABI in-process: allocation, statistics, snapshots, caps, and bad input that leaves the
// allocator's statistics unchanged, after which allocation and free keep working.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "capi_json.hpp"
#include "stowage/runtime.hpp"
#include "stowage/stowage.h"

namespace {

// Two emulated devices (on a machine without a GPU), set before the library reads its config.
const bool env_set = [] { return setenv("STOWAGE_EMULATED_DEVICES", "2", 0) == 0; }();

constexpr ssize_t kMiB = 1 << 20;

std::string pointer_text(const void* p) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", p);
  return text;
}

nlohmann::json stats(int device) { return stowage::test::capi_json(stowage_get_stats, device); }

// The statistics a rejected call must not move.
nlohmann::json state_of(int device) {
  nlohmann::json s = stats(device), out;
  for (const char* key : {"allocated_bytes.all.current", "allocated_bytes.all.allocated", "allocated_bytes.all.freed",
                          "reserved_bytes.all.current", "active_bytes.all.current", "requested_bytes.all.current",
                          "allocation.all.current", "allocation.all.allocated", "segment.all.current"})
    out[key] = s.at(key);
  return out;
}

std::string error() { return stowage_last_error(); }

// Emulated device memory is host memory; CUDA device memory is not touched from the host here.
bool host_accessible() { return stowage_using_cuda() == 0; }

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(env_set);
    ASSERT_GE(stowage_device_count(), 1) << error();
    ASSERT_EQ(stowage_set_memory_cap(0, 0), 0) << error();
  }
  void TearDown() override {
    EXPECT_EQ(stats(0)["allocation.all.current"], 0) << "a test leaked a block";
    stowage_empty_cache(0);
  }
};

TEST_F(CApiTest, MallocGivesWritableMemoryCountedInStats) {
  auto* p = static_cast<unsigned char*>(stowage_malloc(1000, 0, nullptr));
  ASSERT_NE(p, nullptr) << error();
  EXPECT_EQ(error(), "");
  if (host_accessible()) {
    std::memset(p, 0xAB, 1000);
    EXPECT_EQ(p[999], 0xAB);
  }
  auto s = stats(0);
  EXPECT_EQ(s["allocation.all.current"], 1);
  EXPECT_EQ(s["requested_bytes.all.current"], 1000);
  EXPECT_GE(s["allocated_bytes.all.current"].get<long>(), 1000);
  stowage_free(p, 1000, 0, nullptr);
  EXPECT_EQ(error(), "");
  s = stats(0);
  EXPECT_EQ(s["allocation.all.current"], 0);
  EXPECT_EQ(s["allocated_bytes.all.current"], 0);
  EXPECT_GT(s["reserved_bytes.all.current"].get<long>(), 0);  // cached
  EXPECT_EQ(stowage_empty_cache(0), 0);
  EXPECT_EQ(stats(0)["reserved_bytes.all.current"], 0);
}

TEST_F(CApiTest, ZeroBytesIsNullWithoutError) {
  EXPECT_EQ(stowage_malloc(0, 0, nullptr), nullptr);
  EXPECT_EQ(error(), "");
  stowage_free(nullptr, 0, 0, nullptr);
  EXPECT_EQ(error(), "");
}

TEST_F(CApiTest, StatsBufferIsTruncatedLikeSnprintf) {
  const ssize_t n = stowage_get_stats(0, nullptr, 0);
  ASSERT_GT(n, 32);
  char small[16];
  std::memset(small, 'x', sizeof small);
  EXPECT_EQ(stowage_get_stats(0, small, sizeof small), n);
  EXPECT_EQ(small[15], '\0');
  EXPECT_EQ(std::strlen(small), 15u);
  EXPECT_EQ(std::string(small, 2), "{\"");
  EXPECT_EQ(stowage_get_stats(0, nullptr, 10), -1);
  EXPECT_NE(error().find("null buffer"), std::string::npos);
  EXPECT_EQ(stowage_get_stats(99, small, sizeof small), -1);
}

TEST_F(CApiTest, BadInputChangesNothingAndAllocationContinues) {
  void* a = stowage_malloc(3 * kMiB, 0, nullptr);
  void* b = stowage_malloc(4096, 0, nullptr);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const nlohmann::json before = state_of(0);

  EXPECT_EQ(stowage_malloc(-5, 0, nullptr), nullptr);
  EXPECT_NE(error().find("negative size"), std::string::npos) << error();
  EXPECT_EQ(stowage_malloc(16, 57, nullptr), nullptr);
  EXPECT_NE(error().find("device 57"), std::string::npos) << error();
  EXPECT_EQ(stowage_malloc(16, -1, nullptr), nullptr);

  int on_stack = 0;
  stowage_free(&on_stack, 4, 0, nullptr);  // foreign pointer
  EXPECT_NE(error(), "");
  stowage_free(static_cast<char*>(a) + 512, 512, 0, nullptr);  // inside a block, not its start
  EXPECT_NE(error(), "");
  stowage_free(b, 4095, 0, nullptr);  // wrong size
  EXPECT_NE(error().find("4095"), std::string::npos) << error();
  stowage_free(b, -4096, 0, nullptr);
  EXPECT_NE(error().find("negative size"), std::string::npos) << error();
  stowage_free(b, 4096, 42, nullptr);  // no such device
  EXPECT_NE(error(), "");
  EXPECT_EQ(stowage_record_stream(&on_stack, 0, nullptr), -1);
  EXPECT_NE(error(), "");
  EXPECT_EQ(stowage_record_stream(nullptr, 0, nullptr), -1);
  if (!stowage_using_cuda()) {  // CUDA cannot tell every non-handle from a stream without using it
    void* bogus = reinterpret_cast<void*>(std::uintptr_t{0xdead0});
    EXPECT_EQ(stowage_record_stream(b, 0, bogus), -1);
    EXPECT_NE(error().find("stream"), std::string::npos) << error();
    EXPECT_EQ(stowage_malloc(4096, 0, bogus), nullptr);
    EXPECT_NE(error().find("stream"), std::string::npos) << error();
  }
  EXPECT_EQ(state_of(0), before);

  // Double free: the first free works, the second changes nothing.
  stowage_free(b, 4096, 0, nullptr);
  EXPECT_EQ(error(), "");
  const nlohmann::json after_free = state_of(0);
  stowage_free(b, 4096, 0, nullptr);
  EXPECT_NE(error(), "");
  EXPECT_EQ(state_of(0), after_free);

  // Allocation and free still work, and the books balance.
  void* c = stowage_malloc(4096, 0, nullptr);
  ASSERT_NE(c, nullptr) << error();
  if (host_accessible()) std::memset(c, 1, 4096);
  stowage_free(c, 4096, 0, nullptr);
  stowage_free(a, 3 * kMiB, 0, nullptr);
  EXPECT_EQ(error(), "");
  EXPECT_EQ(stats(0)["allocated_bytes.all.current"], 0);
}

TEST_F(CApiTest, FreeOrRecordStreamOnTheWrongDeviceNamesTheOwner) {
  if (stowage_device_count() < 2) GTEST_SKIP() << "needs two devices (emulated: STOWAGE_EMULATED_DEVICES=2)";
  void* p = stowage_malloc(8192, 1, nullptr);
  ASSERT_NE(p, nullptr) << error();
  void* q = stowage_malloc(8192, 0, nullptr);  // device 0's allocator exists too
  const nlohmann::json before0 = state_of(0), before1 = state_of(1);
  stowage_free(p, 8192, 0, nullptr);
  EXPECT_NE(error().find("stowage_free: " + pointer_text(p) + " belongs to device 1, not device 0"), std::string::npos)
      << error();
  EXPECT_EQ(stowage_record_stream(p, 0, nullptr), -1);
  EXPECT_NE(error().find("stowage_record_stream: " + pointer_text(p) + " belongs to device 1, not device 0"),
            std::string::npos)
      << error();
  EXPECT_EQ(state_of(0), before0);
  EXPECT_EQ(state_of(1), before1);
  stowage_free(p, 8192, 1, nullptr);
  stowage_free(q, 8192, 0, nullptr);
  EXPECT_EQ(error(), "");
  EXPECT_EQ(stats(1)["allocation.all.current"], 0);
}

// Device -1 frees on the owner's allocator (PyTorch's raw_delete names no device); a pointer no
// device owns, or one freed already, is refused and changes nothing.
TEST_F(CApiTest, FreeOnDeviceMinusOneFindsTheOwner) {
  if (stowage_device_count() < 2) GTEST_SKIP() << "needs two devices (emulated: STOWAGE_EMULATED_DEVICES=2)";
  void* p = stowage_malloc(8192, 1, nullptr);
  ASSERT_NE(p, nullptr) << error();
  void* q = stowage_malloc(4096, 0, nullptr);
  ASSERT_NE(q, nullptr) << error();
  EXPECT_EQ(stats(1)["allocated_bytes.all.current"], 8192);
  stowage_free(p, 0, -1, nullptr);
  EXPECT_EQ(error(), "");
  EXPECT_EQ(stats(1)["allocated_bytes.all.current"], 0);
  EXPECT_EQ(stats(0)["allocated_bytes.all.current"], 4096);
  const nlohmann::json before0 = state_of(0), before1 = state_of(1);
  stowage_free(p, 0, -1, nullptr);  // again
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(error().find("stowage_free: " + pointer_text(p) + " is not a live stowage block"), std::string::npos)
      << error();
  int on_stack = 0;
  stowage_free(&on_stack, 0, -1, nullptr);
  EXPECT_NE(error().find("is not a live stowage block"), std::string::npos) << error();
  EXPECT_EQ(state_of(0), before0);
  EXPECT_EQ(state_of(1), before1);
  stowage_free(q, 0, -1, nullptr);
  EXPECT_EQ(error(), "");
  EXPECT_EQ(stats(0)["allocation.all.current"], 0);
}

// stowage_block_device names the device whose allocator gave a live block; NULL, foreign
// memory, an interior pointer and a freed block are -1 with no error (the drop-in's
// record_stream hook skips them, as PyTorch's allocator does), and nothing changes.
TEST_F(CApiTest, BlockDeviceNamesTheOwnerAndMinusOneForAnythingElse) {
  const int last = stowage_device_count() - 1;
  void* p = stowage_malloc(8192, last, nullptr);
  ASSERT_NE(p, nullptr) << error();
  const nlohmann::json before = state_of(last);
  EXPECT_EQ(stowage_block_device(p), last);
  EXPECT_EQ(error(), "");
  int on_stack = 0;
  for (const void* other : {static_cast<const void*>(nullptr), static_cast<const void*>(&on_stack),
                            static_cast<const void*>(static_cast<char*>(p) + 512)}) {
    EXPECT_EQ(stowage_block_device(other), -1);
    EXPECT_EQ(stowage_last_error_code(), STOWAGE_OK) << error();
  }
  EXPECT_EQ(state_of(last), before);
  stowage_free(p, 8192, last, nullptr);
  EXPECT_EQ(stowage_block_device(p), -1);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_OK) << error();
}

// A stream made and destroyed through stowage's device while blocks were freed on it: malloc on
// it is refused, changing nothing, and what was freed on it serves the default stream without
// growing (its work finished when it was destroyed).
TEST_F(CApiTest, ADestroyedStreamIsRefusedAndItsMemoryServesOthers) {
  stowage::Device& dev = stowage::device(0);
  ASSERT_EQ(stowage_empty_cache(0), 0) << error();
  void* s = stowage::native(dev.create_stream());
  void* p = stowage_malloc(kMiB, 0, s);
  void* full = stowage_malloc(kMiB, 0, s);  // the first 2 MiB segment (or mapping) is full
  ASSERT_NE(p, nullptr) << error();
  ASSERT_NE(full, nullptr) << error();
  stowage_free(p, kMiB, 0, s);
  void* again = stowage_malloc(kMiB, 0, s);  // s still lives: its block comes back
  EXPECT_EQ(again, p) << error();
  stowage_free(again, kMiB, 0, s);
  dev.destroy_stream(stowage::stream_from_native(s));
  const nlohmann::json before = state_of(0);
  EXPECT_EQ(stowage_malloc(kMiB, 0, s), nullptr);
  EXPECT_NE(error().find("stream"), std::string::npos) << error();
  EXPECT_EQ(state_of(0), before);
  void* q = stowage_malloc(kMiB, 0, nullptr);
  EXPECT_EQ(q, p) << error();
  EXPECT_EQ(stats(0)["reserved_bytes.all.current"], before["reserved_bytes.all.current"]);
  stowage_free(q, kMiB, 0, nullptr);
  stowage_free(full, kMiB, 0, nullptr);
  EXPECT_EQ(error(), "");
}

TEST_F(CApiTest, AllocationBeyondTheCapFailsCleanly) {
  ASSERT_EQ(stowage_set_memory_cap(0, 32 * kMiB), 0) << error();
  void* a = stowage_malloc(16 * kMiB, 0, nullptr);
  ASSERT_NE(a, nullptr) << error();
  const nlohmann::json before = state_of(0);
  EXPECT_EQ(stowage_malloc(64 * kMiB, 0, nullptr), nullptr);
  EXPECT_NE(error(), "");
  EXPECT_EQ(state_of(0), before);
  void* b = stowage_malloc(8 * kMiB, 0, nullptr);  // still fits under the cap
  EXPECT_NE(b, nullptr) << error();
  stowage_free(b, 8 * kMiB, 0, nullptr);
  stowage_free(a, 16 * kMiB, 0, nullptr);
  EXPECT_EQ(stowage_set_memory_cap(0, 0), 0);
  void* big = stowage_malloc(64 * kMiB, 0, nullptr);  // no cap now
  EXPECT_NE(big, nullptr) << error();
  stowage_free(big, 64 * kMiB, 0, nullptr);
}

// What PyTorch sees through the error code: a size is out of memory however large (PyTorch's
// own allocator raises OutOfMemoryError for any size); only a negative one is invalid.
TEST_F(CApiTest, HugeSizesAreOutOfMemoryAndNegativeOnesInvalid) {
  const nlohmann::json before = state_of(0);
  const auto ooms = stats(0)["num_ooms"].get<long>();
  long expected_ooms = ooms;
  for (ssize_t size : {std::int64_t{1} << 40, std::int64_t{1} << 48, (std::int64_t{1} << 60) + 1, std::int64_t{1} << 62,
                       std::numeric_limits<std::int64_t>::max()}) {
    EXPECT_EQ(stowage_malloc(size, 0, nullptr), nullptr);
    EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_OUT_OF_MEMORY) << size << ": " << error();
    EXPECT_NE(error().find("out of memory on device 0"), std::string::npos) << error();
    EXPECT_EQ(stats(0)["num_ooms"].get<long>(), ++expected_ooms);
  }
  EXPECT_EQ(stowage_malloc(-1, 0, nullptr), nullptr);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(state_of(0), before);
}

TEST_F(CApiTest, ATinyMemoryFractionIsACapOfOneByteNotNone) {
  ASSERT_EQ(stowage_set_memory_fraction(0, 1e-12), 0) << error();  // 1e-12 of the capacity rounds to 0 bytes
  EXPECT_EQ(stowage_malloc(512, 0, nullptr), nullptr);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_OUT_OF_MEMORY);
  // PyTorch's fraction 0 (its range is [0, 1]): a cap no reservation fits.
  EXPECT_EQ(stowage_set_memory_fraction(0, 0.0), 0) << error();
  EXPECT_EQ(stowage_malloc(512, 0, nullptr), nullptr);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(stowage_set_memory_cap(0, 0), 0);
  void* p = stowage_malloc(512, 0, nullptr);
  EXPECT_NE(p, nullptr) << error();
  stowage_free(p, 512, 0, nullptr);
}

TEST_F(CApiTest, PeakStatsReset) {
  void* p = stowage_malloc(2 * kMiB, 0, nullptr);
  stowage_free(p, 2 * kMiB, 0, nullptr);
  EXPECT_GE(stats(0)["allocated_bytes.all.peak"].get<long>(), 2 * kMiB);
  EXPECT_EQ(stowage_reset_peak_stats(0), 0);
  EXPECT_EQ(stats(0)["allocated_bytes.all.peak"], 0);
  EXPECT_EQ(stowage_reset_peak_stats(7), -1);
}

TEST_F(CApiTest, SnapshotWritesJsonOfTheLiveBlocks) {
  void* p = stowage_malloc(12345, 0, nullptr);
  ASSERT_NE(p, nullptr);
  const auto path =
      std::filesystem::temp_directory_path() / ("stowage_capi_snapshot_" + std::to_string(getpid()) + ".json");
  ASSERT_EQ(stowage_snapshot(0, path.c_str()), 0) << error();
  std::ifstream in(path);
  const nlohmann::json snap = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  bool found = false;
  for (const auto& seg : snap.at("segments"))
    for (const auto& block : seg.at("blocks"))
      if (block.at("requested_size") == 12345) found = true;
  EXPECT_TRUE(found) << snap.dump().substr(0, 400);
  EXPECT_EQ(stowage_snapshot(0, "/nonexistent-dir/x.json"), -1);
  EXPECT_NE(error().find("/nonexistent-dir/x.json"), std::string::npos);
  EXPECT_EQ(stowage_snapshot(0, nullptr), -1);
  stowage_free(p, 12345, 0, nullptr);
}

TEST(CApiThreads, ConcurrentFirstUseAndTrafficBalance) {
  // In its own process (ctest runs each case alone) this is also the first use of the library:
  // every thread races to create the devices and allocators.
  const int devices = std::min(stowage_device_count(), 2);
  ASSERT_GE(devices, 1) << error();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      void* held[16] = {};
      for (int i = 0; i < 2000; ++i) {
        const int slot = (i * 7 + t) % 16;
        const ssize_t size = 512 * (1 + (slot + t) % 9);
        const int dev = slot % devices;
        if (held[slot] != nullptr) {
          stowage_free(held[slot], 512 * (1 + (slot + t) % 9), dev, nullptr);
          if (*stowage_last_error() != '\0') ++failures;
          held[slot] = nullptr;
        } else if ((held[slot] = stowage_malloc(size, dev, nullptr)) == nullptr) {
          ++failures;
        }
      }
      for (int slot = 0; slot < 16; ++slot)
        if (held[slot] != nullptr) stowage_free(held[slot], 512 * (1 + (slot + t) % 9), slot % devices, nullptr);
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (int d = 0; d < devices; ++d) {
    const auto s = stats(d);
    EXPECT_EQ(s["allocation.all.current"], 0) << "device " << d;
    EXPECT_EQ(s["requested_bytes.all.current"], 0) << "device " << d;
    EXPECT_EQ(s["allocation.all.allocated"], s["allocation.all.freed"]) << "device " << d;
  }
}

TEST_F(CApiTest, ErrorsAreKeptPerThread) {
  EXPECT_EQ(stowage_malloc(-1, 0, nullptr), nullptr);
  std::string other;
  std::thread([&] { other = stowage_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_NE(error(), "");
}

}  // namespace
