// The caching allocator on a real GPU: expandable segments through the driver's virtual-memory
// API, stream-ordered reuse, and registration of an expandable segment with NCCL (a one-rank
// communicator, NCCL loaded with dlopen from the CUDA toolkit). Skips without a GPU.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <vector>

#include "allocator_test_util.hpp"
#include "stowage/cuda_device.hpp"

namespace stowage {
namespace {

using namespace test;

std::unique_ptr<Device> gpu_or_skip() {
  if (cuda_device_count() == 0) return nullptr;
  return make_cuda_device(0);
}

#define SKIP_WITHOUT_GPU(dev) \
  auto dev = gpu_or_skip();   \
  if (!dev) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason()

std::vector<std::uint8_t> read_back(Device& dev, const void* p, std::size_t n, Stream s) {
  std::vector<std::uint8_t> out(n);
  dev.copy_async(out.data(), p, n, CopyKind::device_to_host, s);
  dev.synchronize(s);
  return out;
}

TEST(AllocatorCuda, ExpandableSegmentsMapGranules) {
  SKIP_WITHOUT_GPU(dev);
  CachingAllocator a(*dev);
  if (!dev->properties().virtual_memory) GTEST_SKIP() << "the driver has no virtual memory management";
  ASSERT_EQ(a.segment_mode(), SegmentMode::expandable);
  const std::size_t g = dev->properties().granularity;
  void* x = a.allocate(3 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes.all.current, static_cast<std::int64_t>((3 * MiB + g - 1) / g * g));
  Stream s = dev->create_stream();
  dev->fill_async(x, 0x7e, 3 * MiB, s);
  auto back = read_back(*dev, x, 3 * MiB, s);
  EXPECT_EQ(back.front(), 0x7e);
  EXPECT_EQ(back.back(), 0x7e);
  a.deallocate(x);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes.all.current, 0);
  dev->destroy_stream(s);
}

TEST(AllocatorCuda, StreamOrderedReuse) {
  SKIP_WITHOUT_GPU(dev);
  CachingAllocator a(*dev, classic_options());
  Stream s1 = dev->create_stream(), s2 = dev->create_stream();
  void* x = a.allocate(MiB, s1);
  void* y = a.allocate(MiB, s1);
  a.deallocate(x);
  EXPECT_EQ(a.allocate(MiB, s1), x);  // same stream: at once
  a.record_stream(x, s2);
  a.deallocate(x);
  void* z = a.allocate(MiB, s1);  // pending on s2: handed out after a device-side wait
  EXPECT_EQ(z, x);
  EXPECT_LE(a.stats().num_stream_waits, 1);
  EXPECT_EQ(a.stats().num_device_alloc, 1);
  a.deallocate(z);
  a.deallocate(y);
  dev->synchronize();
  dev->destroy_stream(s1);
  dev->destroy_stream(s2);
}

// The few NCCL entry points used, with nccl.h's types (NCCL 2.19+ for ncclCommRegister).
struct Nccl {
  struct UniqueId {
    char internal[128];
  };
  using Comm = void*;
  int (*get_unique_id)(UniqueId*) = nullptr;
  int (*comm_init_rank)(Comm*, int, UniqueId, int) = nullptr;
  int (*comm_register)(Comm, void*, std::size_t, void**) = nullptr;
  int (*comm_deregister)(Comm, void*) = nullptr;
  int (*all_reduce)(const void*, void*, std::size_t, int, int, Comm, void*) = nullptr;
  int (*comm_destroy)(Comm) = nullptr;
  const char* (*error_string)(int) = nullptr;
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  Nccl() {
    if (!lib) return;
    get_unique_id = reinterpret_cast<decltype(get_unique_id)>(dlsym(lib, "ncclGetUniqueId"));
    comm_init_rank = reinterpret_cast<decltype(comm_init_rank)>(dlsym(lib, "ncclCommInitRank"));
    comm_register = reinterpret_cast<decltype(comm_register)>(dlsym(lib, "ncclCommRegister"));
    comm_deregister = reinterpret_cast<decltype(comm_deregister)>(dlsym(lib, "ncclCommDeregister"));
    all_reduce = reinterpret_cast<decltype(all_reduce)>(dlsym(lib, "ncclAllReduce"));
    comm_destroy = reinterpret_cast<decltype(comm_destroy)>(dlsym(lib, "ncclCommDestroy"));
    error_string = reinterpret_cast<decltype(error_string)>(dlsym(lib, "ncclGetErrorString"));
  }
  bool ok() const {
    return lib && get_unique_id && comm_init_rank && comm_register && comm_deregister && all_reduce && comm_destroy &&
           error_string;
  }
};

TEST(AllocatorCuda, ExpandableSegmentRegistersWithNccl) {
  SKIP_WITHOUT_GPU(dev);
  if (!dev->properties().virtual_memory) GTEST_SKIP() << "the driver has no virtual memory management";
  Nccl nccl;
  if (!nccl.ok()) GTEST_SKIP() << "libnccl.so.2 (2.19+) not loadable: " << (nccl.lib ? "missing symbols" : dlerror());
  CachingAllocator a(*dev);
  ASSERT_EQ(a.segment_mode(), SegmentMode::expandable);
  Stream s = dev->create_stream();
  const std::size_t n = 6 * MiB;  // spans three 2 MiB granules, each its own physical chunk
  void* buf = a.allocate(n, s);
  dev->fill_async(buf, 3, n, s);
  Nccl::UniqueId id{};
  ASSERT_EQ(nccl.get_unique_id(&id), 0);
  Nccl::Comm comm = nullptr;
  int rc = nccl.comm_init_rank(&comm, 1, id, 0);
  ASSERT_EQ(rc, 0) << nccl.error_string(rc);
  void* handle = nullptr;
  rc = nccl.comm_register(comm, buf, n, &handle);
  EXPECT_EQ(rc, 0) << "ncclCommRegister on an expandable segment: " << nccl.error_string(rc);
  constexpr int kUint8 = 1, kSum = 0;
  rc = nccl.all_reduce(buf, buf, n, kUint8, kSum, comm, native(s));
  EXPECT_EQ(rc, 0) << nccl.error_string(rc);
  auto back = read_back(*dev, buf, n, s);
  EXPECT_EQ(back[0], 3);
  EXPECT_EQ(back[n - 1], 3);
  if (handle) EXPECT_EQ(nccl.comm_deregister(comm, handle), 0);
  nccl.comm_destroy(comm);
  a.deallocate(buf);
  dev->synchronize();
  dev->destroy_stream(s);
}

}  // namespace
}  // namespace stowage
