// Lifetimes on the offload layer: a host pool must outlive the swap schedulers and optimizers
// that keep buffers in it. Destroying it first used to unmap their pages under them (a crash,
// and swapped activations lost, when the scheduler or the optimizer next touched them); now the
// pool's destruction ends the process at once with a message naming both. Likewise a pool must
// not outlive its device.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/host_pool.hpp"
#include "stowage/offload.hpp"
#include "stowage/swap.hpp"

namespace stowage {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

class OffloadLifetime : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(OffloadLifetime, APoolDestroyedBeforeASchedulerHoldingASwappedTensorEndsTheProcess) {
  EXPECT_DEATH(
      {
        auto device = make_emulated_device(0, {.capacity = 64 * MiB});
        auto allocator = std::make_shared<CachingAllocator>(*device);
        auto pool = std::make_unique<HostPool>(*device);
        auto swap = std::make_unique<SwapScheduler>(allocator, *pool, SwapOptions{.policy = {.tags = {}}});
        auto t = TensorView::empty(allocator, DType::f32, {1 << 18});
        device->fill_async(t.data(), 0x3F, t.nbytes(), kDefaultStream);
        if (swap->offload(t, 0, "x") != SwapDecision::swapped) std::exit(3);
        pool.reset();
      },
      "stowage: fatal: HostPool 0x[0-9a-f]+ \\(device 0\\) destroyed while 1 object\\(s\\) made on it still live: "
      "SwapScheduler 0x[0-9a-f]+");
}

TEST_F(OffloadLifetime, APoolDestroyedBeforeAnOffloadedAdamEndsTheProcess) {
  EXPECT_DEATH(
      {
        auto device = make_emulated_device(0, {.capacity = 64 * MiB});
        auto allocator = std::make_shared<CachingAllocator>(*device);
        auto pool = std::make_unique<HostPool>(*device);
        auto adam = std::make_unique<OffloadedAdam>(allocator, *pool, 4096,
                                                    OffloadOptions{StatePlacement::streamed, 3 * 512 * 8, 512});
        pool.reset();
      },
      "HostPool 0x[0-9a-f]+ \\(device 0\\) destroyed while 1 object\\(s\\) made on it still live: "
      "OffloadedAdam 0x[0-9a-f]+");
}

TEST_F(OffloadLifetime, ADeviceDestroyedBeforeItsPoolEndsTheProcess) {
  EXPECT_DEATH(
      {
        auto device = make_emulated_device(0, {.capacity = 64 * MiB});
        auto pool = std::make_unique<HostPool>(*device);
        device.reset();
      },
      "device 0 \\(emulated.*\\) destroyed while 1 object\\(s\\) made on it still live: HostPool 0x[0-9a-f]+");
}

// In the right order a swapped tensor comes back when the scheduler goes, and everything else
// is quiet.
TEST_F(OffloadLifetime, InTheRightOrderTheSwappedTensorComesBack) {
  auto device = make_emulated_device(0, {.capacity = 64 * MiB});
  auto allocator = std::make_shared<CachingAllocator>(*device);
  auto pool = std::make_unique<HostPool>(*device);
  auto swap = std::make_unique<SwapScheduler>(allocator, *pool, SwapOptions{.policy = {.tags = {}}});
  auto adam = std::make_unique<OffloadedAdam>(allocator, *pool, 4096,
                                              OffloadOptions{StatePlacement::streamed, 3 * 512 * 8, 512});
  std::vector<float> v(1 << 18, 1.5f);
  auto t = TensorView::empty(allocator, DType::f32, {1 << 18});
  device->copy_async(t.data(), v.data(), t.nbytes(), CopyKind::host_to_device, kDefaultStream);
  ASSERT_EQ(swap->offload(t, 0, "x"), SwapDecision::swapped);
  swap.reset();
  adam.reset();
  pool.reset();
  ASSERT_TRUE(t.storage().resident());
  std::vector<float> back(v.size());
  device->copy_async(back.data(), t.data(), t.nbytes(), CopyKind::device_to_host, kDefaultStream);
  device->synchronize();
  EXPECT_EQ(back, v);
}

}  // namespace
}  // namespace stowage
