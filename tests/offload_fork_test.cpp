// The offload layer in a process forked from the one that made it: the host pool's pages are
// pinned for the parent's device and its lock may be held by a parent's thread that fork() did
// not copy, so every pool operation there is refused with a DeviceError naming fork() before it
// takes the lock; a swap scheduler and an offloaded optimizer refuse too (through the device or
// the pool), and destroying them, the pool, the allocator and the device works. The parent goes on.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "fork_test_util.hpp"
#include "stowage/allocator.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/host_pool.hpp"
#include "stowage/offload.hpp"
#include "stowage/swap.hpp"

namespace stowage {
namespace {

using test::in_child;
using test::refusals;

constexpr std::size_t MiB = std::size_t{1} << 20;

TEST(OffloadFork, ThePoolAndTheTechniquesOnItRefuseInAForkedChildAndDestroyingWorks) {
  auto device = make_emulated_device(0, {.capacity = 64 * MiB});
  auto allocator = std::make_shared<CachingAllocator>(*device);
  auto pool = std::make_unique<HostPool>(*device, HostPoolOptions{.backend = HostPoolBackend::builtin});
  auto swap = std::make_unique<SwapScheduler>(allocator, *pool, SwapOptions{.policy = {.tags = {}}});
  auto adam = std::make_unique<OffloadedAdam>(allocator, *pool, 4096,
                                              OffloadOptions{StatePlacement::streamed, 3 * 512 * 8, 512});
  std::vector<float> v(1 << 18, 1.5f);
  auto t = TensorView::empty(allocator, DType::f32, {1 << 18});
  device->copy_async(t.data(), v.data(), t.nbytes(), CopyKind::host_to_device, kDefaultStream);
  ASSERT_EQ(swap->offload(t, 0, "x"), SwapDecision::swapped);
  void* held = pool->allocate(4096);
  void* cached = pool->allocate(4096);
  pool->deallocate(cached);  // its pages stay pinned in the pool: a child must not get them

  const int status = in_child([&] {
    const int code = refusals({
        [&] { (void)pool->allocate(4096); },
        [&] { pool->deallocate(held); },
        [&] { (void)pool->owns(held); },
        [&] { (void)pool->usable_size(held); },
        [&] { (void)pool->node_of(held); },
        [&] { (void)pool->release_unused(); },
        [&] { (void)pool->stats(); },
        [&] { pool->reset_peak_stats(); },
        [&] { (void)pool->attach("a child's object"); },
        [&] { swap->prefetch(0); },
        [&] { (void)swap->acquire(t); },
    });
    if (code != 0) return code;
    swap.reset();
    adam.reset();
    pool.reset();
    t = TensorView();
    allocator.reset();
    device.reset();
    return 0;
  });
  EXPECT_EQ(status, 0) << "10 + i: operation i was not refused; 100 + i: it threw something else; 98: "
                          "destroying threw; 128 + n: signal n";

  // The parent's objects are as they were.
  EXPECT_TRUE(pool->owns(held));
  pool->deallocate(held);
  const TensorView back_view = swap->acquire(t);
  std::vector<float> back(v.size());
  device->copy_async(back.data(), back_view.data(), back_view.nbytes(), CopyKind::device_to_host, kDefaultStream);
  device->synchronize();
  EXPECT_EQ(back, v);
  swap.reset();
  adam.reset();
  EXPECT_EQ(pool->stats().live_buffers, 0u);
}

}  // namespace
}  // namespace stowage
