// The swap scheduler, case by case, on an emulated device with a throttled link.
#include <gtest/gtest.h>

#include "offload_test_util.hpp"
#include "stowage/allocator.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/host_pool.hpp"
#include "stowage/swap.hpp"

namespace stowage {
namespace {

using namespace stowage::testing;

constexpr std::size_t MiB = std::size_t{1} << 20;

class SwapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EmulatedOptions o;
    o.capacity = 256 * MiB;
    o.link_bandwidth_gbps = 4.0;
    device_ = make_emulated_device(0, o);
    allocator_ = std::make_unique<CachingAllocator>(*device_);
    pool_ = std::make_unique<HostPool>(*device_);
  }
  std::unique_ptr<SwapScheduler> scheduler(SwapOptions o = {}) {
    return std::make_unique<SwapScheduler>(*allocator_, *pool_, o);
  }
  TensorView tensor(std::size_t bytes, std::uint64_t seed) {
    auto v = TensorView::empty(*allocator_, DType::u8, {static_cast<std::int64_t>(bytes)});
    fill_on(*device_, kDefaultStream, v, seed);
    return v;
  }
  std::uint64_t hash_now(const TensorView& v) {
    std::uint64_t h = 0;
    hash_on(*device_, kDefaultStream, v, &h);
    device_->synchronize(kDefaultStream);
    return h;
  }
  std::int64_t allocated() const { return allocator_->stats().allocated_bytes.all.current; }

  std::unique_ptr<Device> device_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<HostPool> pool_;
};

TEST_F(SwapTest, RoundTripKeepsContentsAndFreesDeviceMemory) {
  auto swap = scheduler();
  const std::int64_t at_start = allocated();
  auto v = tensor(4 * MiB, 1);
  busy_on(*device_, kDefaultStream, 2000);  // the producer is still running when offload is called
  ASSERT_EQ(swap->offload(v, 0, "layer0.attn"), SwapDecision::swapped);
  EXPECT_EQ(v.storage().state(), StorageState::swapped_out);
  EXPECT_EQ(allocated(), at_start);  // the device block went back (stream-ordered on the copy)
  EXPECT_THROW((void)v.data(), InvalidArgument);
  swap->before_backward(0);
  auto r = swap->acquire(v);
  EXPECT_TRUE(r.storage().same_as(v.storage()));
  EXPECT_EQ(hash_now(r), expected_hash(4 * MiB, 1));
  const auto s = swap->stats();
  EXPECT_EQ(s.copies_d2h, 1u);
  EXPECT_EQ(s.copies_h2d, 1u);
  EXPECT_EQ(s.bytes_d2h, 4 * MiB);
  EXPECT_EQ(s.bytes_h2d, 4 * MiB);
  EXPECT_EQ(s.prefetch_on_demand, 0u);
  r = {};
  EXPECT_EQ(v.storage().use_count(), 1);  // the scheduler holds no handle once it came back
  v = {};
  EXPECT_EQ(allocated(), at_start);  // the block went with the last view, before any hook ran
  swap->after_backward(0);
  swap->finish_step();
  EXPECT_EQ(pool_->stats().in_use_bytes, 0u);
  EXPECT_EQ(swap->stats().host_bytes, 0u);
  EXPECT_EQ(swap->stats().tensors_swapped, 0u);
}

TEST_F(SwapTest, TheDeviceBlockIsReusableOnceTheCopyIsDone) {
  auto swap = scheduler();
  auto v = tensor(8 * MiB, 2);
  const auto reserved = allocator_->stats().reserved_bytes.all.current;
  ASSERT_EQ(swap->offload(v, 0, "attn"), SwapDecision::swapped);
  device_->synchronize(swap->d2h_stream());
  auto next = tensor(8 * MiB, 3);  // takes the swapped tensor's block: the device did not grow
  EXPECT_EQ(allocator_->stats().reserved_bytes.all.current, reserved);
  EXPECT_EQ(hash_now(swap->acquire(v)), expected_hash(8 * MiB, 2));
  EXPECT_EQ(hash_now(next), expected_hash(8 * MiB, 3));
}

TEST_F(SwapTest, ReloadRightAfterOffloadWaitsForTheDownload) {
  auto swap = scheduler();
  for (int i = 0; i < 20; ++i) {
    auto v = tensor(2 * MiB, 100 + i);
    ASSERT_EQ(swap->offload(v, i, "attn"), SwapDecision::swapped);
    // Reuse the freed block at once and scribble on it: only safe if the allocator waits for the D2H.
    auto scratch = tensor(2 * MiB, 999);
    auto r = swap->acquire(v);  // H2D issued before the D2H could have finished
    EXPECT_EQ(hash_now(r), expected_hash(2 * MiB, 100 + i)) << "iteration " << i;
  }
  EXPECT_EQ(swap->stats().prefetch_on_demand, 20u);
  swap->finish_step();
  EXPECT_EQ(pool_->stats().in_use_bytes, 0u);
}

TEST_F(SwapTest, EarlierViewsStayValid) {
  auto swap = scheduler();
  auto v = tensor(MiB, 5);
  auto tail = v.slice(0, MiB / 2, MiB);
  const std::uint64_t tail_hash = hash_now(tail);
  swap->offload(v, 3, "attn");
  EXPECT_EQ(tail.storage().state(), StorageState::swapped_out);
  EXPECT_EQ(swap->offload(tail, 3, "attn"), SwapDecision::swapped);  // same storage: nothing more
  EXPECT_EQ(swap->stats().copies_d2h, 1u);
  swap->before_backward(3);
  swap->acquire(tail);
  EXPECT_EQ(hash_now(tail), tail_hash);
  EXPECT_EQ(hash_now(v), expected_hash(MiB, 5));
}

TEST_F(SwapTest, AStorageCanBeSwappedAgainAfterItCameBack) {
  auto swap = scheduler();
  auto v = tensor(2 * MiB, 8);
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(swap->offload(v, 0, "attn"), SwapDecision::swapped) << "round " << round;
    v = swap->acquire(v);
    EXPECT_EQ(hash_now(v), expected_hash(2 * MiB, 8)) << "round " << round;
  }
  EXPECT_EQ(swap->stats().copies_d2h, 3u);
  EXPECT_EQ(swap->stats().copies_h2d, 3u);
  swap->finish_step();
  EXPECT_EQ(pool_->stats().in_use_bytes, 0u);
}

TEST_F(SwapTest, PolicyKeepsWhatItShould) {
  SwapOptions o;
  o.policy.tags = {"attn"};
  o.policy.min_bytes = 512 << 10;
  auto swap = scheduler(o);
  auto small = tensor(100 << 10, 1), mlp = tensor(MiB, 2), attn = tensor(MiB, 3), nested = tensor(MiB, 4);
  EXPECT_EQ(swap->offload(small, 0, "layer0.attn"), SwapDecision::kept_small);
  EXPECT_EQ(swap->offload(mlp, 0, "layer0.mlp"), SwapDecision::kept_tag);
  EXPECT_EQ(swap->offload(mlp, 0, "layer0.attnx"), SwapDecision::kept_tag);
  EXPECT_EQ(swap->offload(attn, 0, "attn"), SwapDecision::swapped);
  EXPECT_EQ(swap->offload(nested, 0, "layer0.attn.core"), SwapDecision::swapped);
  EXPECT_TRUE(small.storage().resident());
  EXPECT_TRUE(mlp.storage().resident());
  const auto s = swap->stats();
  EXPECT_EQ(s.kept_small, 1u);
  EXPECT_EQ(s.kept_tag, 2u);
  EXPECT_EQ(s.copies_d2h, 2u);
  EXPECT_EQ(hash_now(swap->acquire(attn)), expected_hash(MiB, 3));
  EXPECT_EQ(hash_now(swap->acquire(nested)), expected_hash(MiB, 4));
  EXPECT_EQ(hash_now(mlp), expected_hash(MiB, 2));
}

TEST_F(SwapTest, HostCapExhaustedKeepsTensorsOnTheDevice) {
  SwapOptions o;
  o.policy.host_cap_bytes = 3 * MiB;
  auto swap = scheduler(o);
  std::vector<TensorView> vs;
  std::vector<SwapDecision> got;
  for (int i = 0; i < 6; ++i) {
    vs.push_back(tensor(MiB, 10 + i));
    got.push_back(swap->offload(vs.back(), 0, "attn"));
  }
  EXPECT_EQ(std::count(got.begin(), got.end(), SwapDecision::swapped), 3);
  EXPECT_EQ(std::count(got.begin(), got.end(), SwapDecision::kept_host_cap), 3);
  const auto s = swap->stats();
  EXPECT_EQ(s.kept_host_cap, 3u);
  EXPECT_EQ(s.kept_bytes_host_cap, 3 * MiB);
  EXPECT_EQ(s.host_bytes, 3 * MiB);
  swap->before_backward(0);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(hash_now(swap->acquire(vs[i])), expected_hash(MiB, 10 + i));
}

TEST_F(SwapTest, PoolExhaustedKeepsTensorsOnTheDevice) {
  HostPoolOptions po;
  po.cap_bytes = 2 * MiB + (64 << 10);
  po.backend = HostPoolBackend::builtin;
  HostPool small_pool(*device_, po);
  SwapScheduler swap(*allocator_, small_pool);
  std::vector<TensorView> vs;
  int kept = 0;
  for (int i = 0; i < 4; ++i) {
    vs.push_back(tensor(MiB, 20 + i));
    kept += swap.offload(vs.back(), 1, "attn") == SwapDecision::kept_pool_full;
  }
  EXPECT_EQ(kept, 2);
  EXPECT_EQ(swap.stats().kept_pool_full, 2u);
  EXPECT_EQ(swap.stats().kept_bytes_pool_full, 2 * MiB);
  swap.before_backward(1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(hash_now(swap.acquire(vs[i])), expected_hash(MiB, 20 + i));
}

TEST_F(SwapTest, NeverBothSwappedAndReleased) {
  auto swap = scheduler();
  auto released = tensor(MiB, 1), swapped = tensor(MiB, 2);
  device_->synchronize(kDefaultStream);
  released.storage().release(StorageState::released);
  EXPECT_EQ(swap->offload(released, 0, "attn"), SwapDecision::kept_not_resident);
  EXPECT_EQ(released.storage().state(), StorageState::released);
  EXPECT_EQ(swap->stats().kept_not_resident, 1u);
  ASSERT_EQ(swap->offload(swapped, 0, "attn"), SwapDecision::swapped);
  EXPECT_THROW(swapped.storage().release(StorageState::released), InvalidArgument);
  EXPECT_THROW(swap->acquire(released), InvalidArgument);
  EXPECT_EQ(hash_now(swap->acquire(swapped)), expected_hash(MiB, 2));
}

TEST_F(SwapTest, AcquireWithoutDeviceRoomThrowsAndLosesNothing) {
  auto swap = scheduler();
  auto v = tensor(64 * MiB, 7);
  ASSERT_EQ(swap->offload(v, 0, "attn"), SwapDecision::swapped);
  swap->finish_step();
  allocator_->empty_cache();
  std::vector<void*> hog;
  try {
    for (;;) hog.push_back(allocator_->allocate(16 * MiB));
  } catch (const OutOfMemory&) {
  }
  swap->before_backward(0);  // cannot prefetch: put off
  EXPECT_GE(swap->stats().prefetch_oom, 1u);
  EXPECT_THROW(swap->acquire(v), OutOfMemory);
  EXPECT_EQ(v.storage().state(), StorageState::swapped_out);
  for (void* p : hog) allocator_->deallocate(p);
  EXPECT_EQ(hash_now(swap->acquire(v)), expected_hash(64 * MiB, 7));
}

TEST_F(SwapTest, DestroyingTheSchedulerBringsHeldTensorsBack) {
  auto v = tensor(2 * MiB, 9);
  {
    auto swap = scheduler();
    ASSERT_EQ(swap->offload(v, 0, "attn"), SwapDecision::swapped);
  }
  EXPECT_TRUE(v.storage().resident());
  EXPECT_EQ(hash_now(v), expected_hash(2 * MiB, 9));
  EXPECT_EQ(pool_->stats().in_use_bytes, 0u);
  const std::int64_t with_v = allocated();
  v = {};
  EXPECT_EQ(allocated(), with_v - static_cast<std::int64_t>(2 * MiB));
}

TEST_F(SwapTest, DroppedTensorsReturnTheirHostBuffers) {
  auto swap = scheduler();
  const std::int64_t at_start = allocated();
  {
    auto a = tensor(MiB, 1), b = tensor(MiB, 2);
    swap->offload(a, 0, "attn");
    swap->offload(b, 0, "attn");
    swap->prefetch(0);  // b's block is filled but never acquired
  }
  swap->finish_step();
  EXPECT_EQ(swap->stats().host_bytes, 0u);
  EXPECT_EQ(pool_->stats().in_use_bytes, 0u);
  EXPECT_EQ(allocated(), at_start);
}

TEST_F(SwapTest, BadArguments) {
  SwapOptions o;
  o.prefetch_distance = -1;
  EXPECT_THROW(scheduler(o), InvalidArgument);
  auto other = make_emulated_device(1, EmulatedOptions{});
  HostPool foreign(*other);
  EXPECT_THROW(SwapScheduler(*allocator_, foreign), InvalidArgument);
  auto swap = scheduler();
  EXPECT_THROW(swap->offload(TensorView{}, 0, "attn"), InvalidArgument);
  std::vector<unsigned char> bytes(MiB);
  TensorView wrapped(Storage::wrap(*device_, bytes.data(), bytes.size(), {}), DType::u8,
                     {static_cast<std::int64_t>(MiB)});
  EXPECT_EQ(swap->offload(wrapped, 0, "attn"), SwapDecision::kept_not_ours);
  EXPECT_EQ(swap->stats().copies_d2h, 0u);
}

}  // namespace
}  // namespace stowage
