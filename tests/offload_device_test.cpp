// Host pool and swap on every device backend, moving bytes only through the device's copies (so
// the same test runs on a GPU, whose memory the host cannot read). CUDA skips without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "offload_test_util.hpp"
#include "stowage/allocator.hpp"
#include "stowage/cuda_device.hpp"
#include "stowage/host_pool.hpp"
#include "stowage/swap.hpp"

namespace stowage {
namespace {

using namespace stowage::testing;

class OffloadOnDevice : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    if (GetParam() == DeviceKind::cuda && cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
    device_ = make_test_device(GetParam(), {.capacity = std::size_t{256} << 20, .link_bandwidth_gbps = 8.0});
  }
  // Writes `seed`'s pattern into the tensor through an H2D copy; waits for it.
  void upload(const TensorView& v, std::uint64_t seed) {
    std::vector<unsigned char> host(v.nbytes());
    pattern(host.data(), host.size(), seed);
    device_->copy_async(v.data(), host.data(), host.size(), CopyKind::host_to_device, kDefaultStream);
    device_->synchronize(kDefaultStream);
  }
  std::uint64_t download_hash(const TensorView& v) {
    std::vector<unsigned char> host(v.nbytes());
    device_->copy_async(host.data(), v.data(), host.size(), CopyKind::device_to_host, kDefaultStream);
    device_->synchronize(kDefaultStream);
    return hash_bytes(host.data(), host.size());
  }
  std::unique_ptr<Device> device_;
};

TEST_P(OffloadOnDevice, PoolBuffersArePinnedAndCopyBothWays) {
  HostPool pool(*device_);
  const std::size_t n = std::size_t{3} << 20;
  void* src = pool.allocate(n);
  void* back = pool.allocate(n);
  EXPECT_TRUE(device_->is_pinned(src));
  EXPECT_TRUE(device_->is_pinned(back));
  pattern(src, n, 42);
  void* d = device_->allocate(n);
  device_->copy_async(d, src, n, CopyKind::host_to_device, kDefaultStream);
  device_->copy_async(back, d, n, CopyKind::device_to_host, kDefaultStream);
  device_->synchronize(kDefaultStream);
  EXPECT_EQ(hash_bytes(back, n), expected_hash(n, 42));
  device_->deallocate(d);
  pool.deallocate(src);
  pool.deallocate(back);
  const std::size_t pinned = pool.stats().pinned_bytes;
  EXPECT_EQ(pool.release_unused(), pinned);
}

TEST_P(OffloadOnDevice, SwapRoundTripThroughTheLink) {
  CachingAllocator alloc(*device_);
  HostPool pool(*device_);
  const std::int64_t at_start = alloc.stats().allocated_bytes.all.current;
  {
    SwapScheduler swap(alloc, pool);
    std::vector<TensorView> vs;
    for (int layer = 0; layer < 6; ++layer) {
      vs.push_back(TensorView::empty(alloc, DType::f32, {static_cast<std::int64_t>((layer + 1) << 18)}));
      upload(vs.back(), 1000 + layer);
      ASSERT_EQ(swap.offload(vs.back(), layer, "attn"), SwapDecision::swapped);
    }
    for (int layer = 5; layer >= 0; --layer) {
      swap.before_backward(layer);
      const TensorView r = swap.acquire(vs[layer]);
      EXPECT_EQ(download_hash(r), expected_hash(r.nbytes(), 1000 + layer)) << "layer " << layer;
      vs[layer] = {};
      swap.after_backward(layer);
    }
    swap.finish_step();
    const auto s = swap.stats();
    EXPECT_EQ(s.copies_d2h, 6u);
    EXPECT_EQ(s.copies_h2d, 6u);
    EXPECT_EQ(s.bytes_d2h, s.bytes_h2d);
    EXPECT_EQ(s.host_bytes, 0u);
  }
  EXPECT_EQ(alloc.stats().allocated_bytes.all.current, at_start);
  EXPECT_EQ(pool.stats().in_use_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, OffloadOnDevice, ::testing::Values(DeviceKind::emulated, DeviceKind::cuda),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace stowage
