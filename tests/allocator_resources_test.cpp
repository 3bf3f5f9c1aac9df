// Memory resources composed RMM-style: adaptors (statistics, limit, event log) over the caching
// allocator and over a plain device resource; storages and techniques on any resource; and what
// happens when a resource goes before the storages it handed out.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include <unistd.h>

#include "allocator_test_util.hpp"
#include "stowage/caching_allocator.hpp"
#include "stowage/device_resource.hpp"
#include "stowage/dlpack.hpp"
#include "stowage/event_log.hpp"
#include "stowage/limiting_resource.hpp"
#include "stowage/log_level.hpp"
#include "stowage/logging_resource.hpp"
#include "stowage/statistics_resource.hpp"
#include "stowage/tensor.hpp"

namespace stowage {
namespace {

using test::KiB;
using test::MiB;

std::string temp_log(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string(name) + "_" + std::to_string(::getpid()) + ".csv"))
      .string();
}

TEST(Resources, StatisticsCountWhatPassesThroughOverAnyUpstream) {
  auto device = test::small_device();
  CachingAllocator caching(*device);
  DeviceResource plain(*device);
  for (MemoryResource* upstream : {static_cast<MemoryResource*>(&caching), static_cast<MemoryResource*>(&plain)}) {
    StatisticsResource stats(*upstream);
    EXPECT_EQ(stats.upstream(), upstream);
    EXPECT_EQ(&stats.device(), device.get());
    void* a = stats.allocate(1000);
    void* b = stats.allocate(3 * MiB);
    ResourceStatistics s = stats.statistics();
    EXPECT_EQ(s.bytes.current, static_cast<std::int64_t>(1000 + 3 * MiB));
    EXPECT_EQ(s.allocations.current, 2);
    stats.deallocate(a);                                     // size looked up
    EXPECT_THROW(stats.deallocate(b, 12), InvalidArgument);  // wrong size: refused upstream, nothing counted
    EXPECT_EQ(stats.statistics().bytes.current, static_cast<std::int64_t>(3 * MiB));
    stats.deallocate(b, 3 * MiB);
    s = stats.statistics();
    EXPECT_EQ(s.bytes.current, 0);
    EXPECT_EQ(s.bytes.peak, static_cast<std::int64_t>(1000 + 3 * MiB));
    EXPECT_EQ(s.bytes.allocated, static_cast<std::int64_t>(1000 + 3 * MiB));
    EXPECT_EQ(s.bytes.freed, static_cast<std::int64_t>(1000 + 3 * MiB));
    EXPECT_EQ(s.allocations.peak, 2);
    stats.reset_peaks();
    EXPECT_EQ(stats.statistics().bytes.peak, 0);
  }
  EXPECT_EQ(caching.stats().allocated_bytes.all.current, 0);
}

TEST(Resources, LimitRefusesPastItsBudgetAndChangesNothing) {
  auto device = test::small_device();
  CachingAllocator caching(*device);
  LimitingResource limited(caching, 4 * MiB);
  void* a = limited.allocate(3 * MiB);
  EXPECT_EQ(limited.allocated(), 3 * MiB);
  try {
    limited.allocate(2 * MiB);
    FAIL() << "allocated past the limit";
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("limit reached"), std::string::npos) << what;
    EXPECT_NE(what.find("2.00 MiB"), std::string::npos) << what;
    EXPECT_NE(what.find("3.00 MiB of the limit of 4.00 MiB"), std::string::npos) << what;
  }
  EXPECT_EQ(limited.allocated(), 3 * MiB);
  EXPECT_EQ(caching.stats().allocation.all.current, 1);  // nothing reached the allocator
  void* b = limited.allocate(1 * MiB);                   // exactly up to the limit
  limited.set_limit(MiB);                                // lower: live memory stays
  EXPECT_THROW(limited.allocate(1), OutOfMemory);
  limited.deallocate(a, 3 * MiB);
  limited.deallocate(b);
  EXPECT_EQ(limited.allocated(), 0u);
  EXPECT_NE(limited.allocate(MiB), nullptr);
}

TEST(Resources, LimitOverflowingSizesAreRefused) {
  auto device = test::small_device();
  DeviceResource plain(*device);
  LimitingResource limited(plain, 8 * KiB);
  void* a = limited.allocate(8 * KiB);
  EXPECT_THROW(limited.allocate(std::numeric_limits<std::size_t>::max()), OutOfMemory);
  limited.deallocate(a);
}

// The C++ API's allocations reach the event log: storages and tensors from a logging resource
// over a limit over the caching allocator.
TEST(Resources, StoragesThroughALoggingStackAreLogged) {
  auto device = test::small_device();
  CachingAllocator caching(*device);
  LimitingResource limited(caching, 16 * MiB);
  const std::string path = temp_log("stowage_resources_log");
  {
    LoggingResource logged(limited, std::make_shared<EventLog>(path));
    EXPECT_EQ(find_resource<CachingAllocator>(logged), &caching);
    EXPECT_EQ(find_resource<LimitingResource>(logged), &limited);
    EXPECT_EQ(find_resource<StatisticsResource>(logged), nullptr);
    void* kept = nullptr;
    {
      Storage s = Storage::allocate(logged, 5000);
      TensorView t = TensorView::empty(logged, DType::f32, {1024});
      kept = s.data();
      EXPECT_EQ(s.resource(), &logged);
      EXPECT_EQ(limited.allocated(), 5000u + 4096u);
      s.release();
      s.materialize(kDefaultStream);
    }
    EXPECT_EQ(limited.allocated(), 0u);
    const auto records = read_event_log(path);
    ASSERT_EQ(records.size(), 6u);
    EXPECT_EQ(records[0].action, EventAction::allocate);
    EXPECT_EQ(records[0].size, 5000u);
    EXPECT_EQ(records[0].pointer, reinterpret_cast<std::uintptr_t>(kept));
    EXPECT_EQ(records[1].size, 4096u);
    EXPECT_EQ(records[2].action, EventAction::free);  // release()
    EXPECT_EQ(records[2].size, 5000u);
    EXPECT_EQ(records[3].action, EventAction::allocate);  // materialize()
    EXPECT_EQ(records[3].size, 5000u);
    int frees = 0;
    for (const auto& r : records) frees += r.action == EventAction::free;
    EXPECT_EQ(frees, 3);
  }
  std::filesystem::remove(path);
}

TEST(Resources, ADeviceResourceGivesEveryByteBack) {
  auto device = test::small_device(64 * MiB);
  const std::size_t before = device->free_memory();
  {
    DeviceResource plain(*device);
    void* a = plain.allocate(MiB);
    EXPECT_EQ(device->free_memory(), before - MiB);
    EXPECT_THROW(plain.deallocate(a, 7), InvalidArgument);
    int local = 0;
    EXPECT_THROW(plain.deallocate(&local), InvalidArgument);
    EXPECT_THROW(plain.record_stream(&local, kDefaultStream), InvalidArgument);
    plain.record_stream(a, kDefaultStream);
    plain.deallocate(a, MiB);
    EXPECT_EQ(device->free_memory(), before);
    plain.allocate(2 * MiB);  // left live: the destructor gives it back
  }
  EXPECT_EQ(device->free_memory(), before);
}

// A storage holds a resource owned by a shared_ptr alive: the last storage gives its bytes back
// to the allocator, which then goes, and the device has everything again.
TEST(Resources, StorageKeepsASharedResourceAlive) {
  auto device = test::small_device(64 * MiB);
  const std::size_t before = device->free_memory();
  Storage s;
  std::weak_ptr<CachingAllocator> watch;
  {
    auto caching = std::make_shared<CachingAllocator>(*device);
    watch = caching;
    s = Storage::allocate(caching, 3 * MiB);
    TensorView t = TensorView::empty(caching, DType::u8, {1000});
  }
  EXPECT_FALSE(watch.expired());
  ASSERT_NE(s.data(), nullptr);
  s.release();
  s.materialize(kDefaultStream);  // the allocator is still there to serve it
  EXPECT_LT(device->free_memory(), before);
  s = {};
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(device->free_memory(), before);
}

// A resource that nothing owns through a shared_ptr cannot be kept alive: a storage that outlives
// it refuses every call that would reach it or its bytes, with a clear error, and its destructor
// touches nothing.
TEST(Resources, StorageOutlivingAStackResourceFailsClearly) {
  auto device = test::small_device(64 * MiB);
  Storage s;
  {
    CachingAllocator caching(*device);
    s = Storage::allocate(caching, MiB);
  }
  try {
    s.release();
    FAIL() << "released into a destroyed allocator";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("was destroyed first"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.state(), StorageState::released);  // its bytes went with the allocator
  EXPECT_THROW(s.materialize(kDefaultStream), InvalidArgument);
  s = {};  // does not touch the freed allocator
  ResourceHandle empty;
  EXPECT_FALSE(empty.valid());
  EXPECT_FALSE(empty.expired());
  EXPECT_THROW(empty.get(), InvalidArgument);
}

// The bytes of a storage whose allocator was destroyed belong to the device again, and another
// allocator hands them out: no view of the old storage may reach them. data() used to return the
// old address (the storage still said resident) and a write through it landed in the new block.
TEST(Resources, AStorageWhoseAllocatorIsGoneNeverShowsItsOldAddress) {
  auto device = test::small_device(64 * MiB);
  TensorView t;
  void* old_address = nullptr;
  {
    CachingAllocator first(*device);
    t = TensorView::empty(first, DType::u8, {4096});
    old_address = t.data();
  }
  CachingAllocator second(*device);
  auto* other = static_cast<unsigned char*>(second.allocate(4096));
  std::memset(other, 0x11, 4096);
  (void)old_address;  // usually `other`: the device hands the same bytes out again

  EXPECT_FALSE(t.storage().resident());
  EXPECT_EQ(t.storage().state(), StorageState::released);
  for (const auto& call : std::vector<std::function<void()>>{
           [&] { (void)t.storage().data(); },
           [&] { (void)t.data(); },
           [&] { (void)t.slice(0, 0, 16).data(); },
           [&] { (void)to_dlpack(t); },
           [&] { t.storage().release(); },
           [&] { t.storage().materialize(kDefaultStream); },
           [&] { t.storage().adopt(other, kDefaultStream); },
       }) {
    try {
      call();
      ADD_FAILURE() << "a call on a storage whose allocator is gone succeeded";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("was destroyed first"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(other[0], 0x11);
  EXPECT_EQ(second.stats().allocation.all.current, 1);
  t = TensorView();  // the last handle goes without touching either allocator
  EXPECT_EQ(second.stats().allocation.all.current, 1);
  second.deallocate(other);
}

// The library never writes to stdout, which belongs to the program: its warnings (here, an
// allocator destroyed with a live block, logged at warn) go to stderr through its own logger.
TEST(Resources, WarningsNeverReachStdout) {
  const std::string out_path = temp_log("stowage_stdout");
  std::fflush(stdout);
  const int saved = ::dup(1);
  ASSERT_GE(saved, 0);
  std::FILE* capture = std::fopen(out_path.c_str(), "w");
  ASSERT_NE(capture, nullptr);
  ::dup2(::fileno(capture), 1);
  const LogLevel level = log_level();
  set_log_level(LogLevel::warn);
  {
    auto device = test::small_device();
    CachingAllocator caching(*device);
    caching.allocate(4096);  // left live: the destructor warns
  }
  set_log_level(level);
  std::fflush(stdout);
  ::dup2(saved, 1);
  ::close(saved);
  std::fclose(capture);
  std::ifstream in(out_path);
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(written, "");
  std::filesystem::remove(out_path);
}

}  // namespace
}  // namespace stowage
