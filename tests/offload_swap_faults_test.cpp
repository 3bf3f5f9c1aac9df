// Swap and the host pool on a device that refuses copies, pins, allocations and mappings: the
// call that meets the refusal reports it (an exception, or a kept_* decision / prefetch_oom as
// docs/swap.md says), the tensor's bytes stay where they were, bit for bit, and no host or
// device byte is left held.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "offload_test_util.hpp"
#include "stowage/allocator.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/fault_injection.hpp"
#include "stowage/host_pool.hpp"
#include "stowage/swap.hpp"

namespace stowage {
namespace {

using namespace stowage::testing;
using ::testing::HasSubstr;

constexpr std::size_t MiB = std::size_t{1} << 20;

class SwapFaults : public ::testing::Test {
 protected:
  void SetUp() override { build(0.0); }

  // A fresh device (link throttled to `link_gbps`, 0 = unthrottled), allocator and pool.
  void build(double link_gbps) {
    pool_.reset();
    allocator_.reset();
    EmulatedOptions o;
    o.capacity = 256 * MiB;
    o.link_bandwidth_gbps = link_gbps;
    device_ = std::make_unique<FaultInjectingDevice>(make_emulated_device(0, o), FaultPlan{});
    allocator_ = std::make_unique<CachingAllocator>(*device_);
    HostPoolOptions po;
    po.backend = HostPoolBackend::builtin;  // the same pinning pattern in every build
    pool_ = std::make_unique<HostPool>(*device_, po);
  }

  void TearDown() override {
    device_->set_plan({});
    pool_.reset();
    allocator_.reset();
    EXPECT_EQ(device_->free_memory(), device_->capacity());
    EXPECT_EQ(device_->counters().pinned_host, 0u);
  }

  std::unique_ptr<SwapScheduler> scheduler() {
    SwapOptions o;
    o.policy.tags = {"attn"};
    return std::make_unique<SwapScheduler>(*allocator_, *pool_, o);
  }
  TensorView tensor(std::size_t bytes, std::uint64_t seed) {
    auto v = TensorView::empty(*allocator_, DType::u8, {static_cast<std::int64_t>(bytes)});
    fill_on(*device_, kDefaultStream, v, seed);
    device_->synchronize(kDefaultStream);
    return v;
  }
  std::uint64_t hash_now(const TensorView& v) {
    std::uint64_t h = 0;
    hash_on(*device_, kDefaultStream, v, &h);
    device_->synchronize(kDefaultStream);
    return h;
  }
  std::int64_t allocated() const { return allocator_->stats().allocated_bytes.all.current; }
  // Host bytes handed out must be exactly what the scheduler says it holds.
  void expect_host_books(std::size_t swapped_bytes, std::size_t buffers) {
    const HostPoolStats p = pool_->stats();
    EXPECT_EQ(p.requested_bytes, swapped_bytes);
    EXPECT_EQ(p.live_buffers, buffers);
    EXPECT_EQ(device_->counters().pinned_host, p.pinned_bytes);
  }

  std::unique_ptr<FaultInjectingDevice> device_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<HostPool> pool_;
};

TEST_F(SwapFaults, OffloadCopyRefusedLeavesTheTensorOnTheDevice) {
  auto swap = scheduler();
  auto v = tensor(4 * MiB, 1);
  void* data = v.data();
  const std::int64_t before = allocated();

  device_->set_plan({.copy_every = 1});
  EXPECT_THROW(swap->offload(v, 0, "layer0.attn"), DeviceError);
  EXPECT_EQ(device_->injected().copy, 1u);
  EXPECT_EQ(v.storage().state(), StorageState::resident);
  EXPECT_EQ(v.data(), data);  // the same block, not a copy of it
  EXPECT_EQ(allocated(), before);
  EXPECT_EQ(hash_now(v), expected_hash(4 * MiB, 1));
  const SwapStats s = swap->stats();
  EXPECT_EQ(s.copies_d2h, 0u);
  EXPECT_EQ(s.bytes_d2h, 0u);
  EXPECT_EQ(s.host_bytes, 0u);
  EXPECT_EQ(s.tensors_swapped, 0u);
  expect_host_books(0, 0);

  device_->set_plan({});  // the same tensor swaps and comes back once the device copies again
  ASSERT_EQ(swap->offload(v, 0, "layer0.attn"), SwapDecision::swapped);
  swap->before_backward(0);
  auto r = swap->acquire(v);
  EXPECT_EQ(hash_now(r), expected_hash(4 * MiB, 1));
  r = {};
  swap->finish_step();
  expect_host_books(0, 0);
}

// An offload records up to four events (the compute stream's point, the copy's start and end
// times, its completion); whichever is refused, the tensor stays resident with its bytes, and the
// host buffer goes back to the pool only after a copy already queued has read it.
TEST_F(SwapFaults, RefusedEventRecordInOffloadLeavesTheTensorOnTheDevice) {
  build(1.0);
  for (std::uint64_t k = 1; k <= 4; ++k) {
    SCOPED_TRACE("the offload's record number " + std::to_string(k) + " is refused");
    auto swap = scheduler();
    auto v = tensor(4 * MiB, 40 + k);
    void* data = v.data();
    const std::int64_t before = allocated();
    const std::uint64_t refused_before = device_->injected().record;

    device_->set_plan({.record_every = k});
    EXPECT_THROW(swap->offload(v, 0, "layer0.attn"), DeviceError);
    device_->set_plan({});
    EXPECT_EQ(device_->injected().record, refused_before + 1);
    EXPECT_EQ(v.storage().state(), StorageState::resident);
    EXPECT_EQ(v.data(), data);
    EXPECT_EQ(allocated(), before);
    EXPECT_EQ(hash_now(v), expected_hash(4 * MiB, 40 + k));
    EXPECT_EQ(swap->stats().tensors_swapped, 0u);
    expect_host_books(0, 0);

    ASSERT_EQ(swap->offload(v, 0, "layer0.attn"), SwapDecision::swapped);  // and it still swaps
    swap->before_backward(0);
    auto r = swap->acquire(v);
    EXPECT_EQ(hash_now(r), expected_hash(4 * MiB, 40 + k));
    r = {};
    v = {};
    swap->finish_step();
    expect_host_books(0, 0);
  }
}

TEST_F(SwapFaults, PrefetchCopyRefusedLeavesTheTensorOnTheHost) {
  auto swap = scheduler();
  auto v = tensor(4 * MiB, 2);
  const std::int64_t at_start = allocated() - static_cast<std::int64_t>(allocator_->block_size(v.data()));
  ASSERT_EQ(swap->offload(v, 0, "layer0.attn"), SwapDecision::swapped);
  device_->synchronize();

  device_->set_plan({.copy_every = 1});
  EXPECT_THROW(swap->before_backward(0), DeviceError);
  EXPECT_EQ(v.storage().state(), StorageState::swapped_out);
  EXPECT_EQ(allocated(), at_start);  // the block the copy was meant to fill went back
  EXPECT_THROW(swap->acquire(v), DeviceError);
  EXPECT_EQ(v.storage().state(), StorageState::swapped_out);
  EXPECT_EQ(allocated(), at_start);
  EXPECT_EQ(device_->injected().copy, 2u);
  SwapStats s = swap->stats();
  EXPECT_EQ(s.copies_h2d, 0u);
  EXPECT_EQ(s.bytes_h2d, 0u);
  EXPECT_EQ(s.host_bytes, 4 * MiB);
  EXPECT_EQ(s.tensors_swapped, 1u);
  expect_host_books(4 * MiB, 1);

  device_->set_plan({});
  auto r = swap->acquire(v);  // the host copy is intact
  EXPECT_EQ(hash_now(r), expected_hash(4 * MiB, 2));
  s = swap->stats();
  EXPECT_EQ(s.copies_h2d, 1u);
  EXPECT_EQ(s.bytes_h2d, 4 * MiB);
  r = {};
  swap->finish_step();
  EXPECT_EQ(swap->stats().host_bytes, 0u);
  expect_host_books(0, 0);
}

// A prefetch records four events: the compute stream's point, the copy's start and end times
// and its completion. Whichever is refused, the tensor stays on the host, and the block meant for
// it is not handed to anyone else while the copy into it may still be running (the link is
// slow, so a block reused at once would be overwritten by the copy).
TEST_F(SwapFaults, RefusedEventRecordInPrefetchLosesNothingAndNoBlockIsReusedUnderTheCopy) {
  build(1.0);  // 4 MiB take 4 ms each way
  for (std::uint64_t k = 1; k <= 4; ++k) {
    SCOPED_TRACE("the prefetch's record number " + std::to_string(k) + " is refused");
    auto swap = scheduler();
    const std::uint64_t seed = 20 + k;
    auto v = tensor(4 * MiB, seed);
    const std::int64_t at_start = allocated() - static_cast<std::int64_t>(allocator_->block_size(v.data()));
    ASSERT_EQ(swap->offload(v, 0, "layer0.attn"), SwapDecision::swapped);
    device_->synchronize();
    const std::uint64_t refused_before = device_->injected().record;

    device_->set_plan({.record_every = k});
    EXPECT_THROW(swap->before_backward(0), DeviceError);
    device_->set_plan({});
    EXPECT_EQ(device_->injected().record, refused_before + 1);
    EXPECT_EQ(v.storage().state(), StorageState::swapped_out);
    EXPECT_EQ(allocated(), at_start);
    EXPECT_EQ(swap->stats().copies_h2d, 0u);

    auto w = tensor(4 * MiB, 99);  // takes the block the prefetch gave back, if it can be taken
    device_->synchronize();
    EXPECT_EQ(hash_now(w), expected_hash(4 * MiB, 99));
    w = {};

    auto r = swap->acquire(v);  // the host copy is intact and comes back
    EXPECT_EQ(hash_now(r), expected_hash(4 * MiB, seed));
    r = {};
    v = {};
    swap->finish_step();
    expect_host_books(0, 0);
    EXPECT_EQ(allocated(), at_start);
  }
}

TEST_F(SwapFaults, NoDeviceMemoryForThePrefetchIsPutOffThenOutOfMemoryInAcquire) {
  for (const FaultPlan plan : {FaultPlan{.allocation_every = 1}, FaultPlan{.map_every = 1}}) {
    auto swap = scheduler();
    auto v = tensor(6 * MiB, 3);
    ASSERT_EQ(swap->offload(v, 1, "layer1.attn"), SwapDecision::swapped);
    swap->finish_step();
    allocator_->empty_cache();  // the prefetch has to grow the pool: the device is asked
    const std::int64_t before = allocated();

    device_->set_plan(plan);
    swap->before_backward(1);
    EXPECT_EQ(swap->stats().prefetch_oom, 1u);
    EXPECT_EQ(v.storage().state(), StorageState::swapped_out);
    try {
      swap->acquire(v);
      ADD_FAILURE() << "acquire succeeded with the device refusing memory";
    } catch (const OutOfMemory& e) {
      EXPECT_THAT(e.what(), HasSubstr("stays on the host, unchanged"));
    }
    EXPECT_EQ(v.storage().state(), StorageState::swapped_out);
    EXPECT_EQ(allocated(), before);
    expect_host_books(6 * MiB, 1);

    device_->set_plan({});
    auto r = swap->acquire(v);
    EXPECT_EQ(hash_now(r), expected_hash(6 * MiB, 3));
    r = {};
    v = {};
    swap->finish_step();
    expect_host_books(0, 0);
  }
}

TEST_F(SwapFaults, PinRefusedKeepsTheTensorOnTheDevice) {
  auto swap = scheduler();
  auto v = tensor(4 * MiB, 4);
  void* data = v.data();
  device_->set_plan({.pin_every = 1});
  EXPECT_EQ(swap->offload(v, 0, "layer0.attn"), SwapDecision::kept_pool_full);
  const SwapStats s = swap->stats();
  EXPECT_EQ(s.kept_pool_full, 1u);
  EXPECT_EQ(s.kept_bytes_pool_full, 4 * MiB);
  EXPECT_EQ(s.copies_d2h, 0u);
  EXPECT_EQ(v.data(), data);
  EXPECT_EQ(hash_now(v), expected_hash(4 * MiB, 4));
  EXPECT_EQ(pool_->stats().pinned_bytes, 0u);  // nothing half-pinned stays behind
  EXPECT_EQ(pool_->stats().num_ooms, 1u);
  expect_host_books(0, 0);
}

TEST_F(SwapFaults, ShutdownRetriesARefusedCopyAndBringsEveryTensorBack) {
  auto swap = scheduler();
  auto a = tensor(2 * MiB, 5), b = tensor(3 * MiB, 6);
  ASSERT_EQ(swap->offload(a, 0, "layer0.attn"), SwapDecision::swapped);
  ASSERT_EQ(swap->offload(b, 1, "layer1.attn"), SwapDecision::swapped);
  device_->synchronize();
  device_->set_plan({.copy_every = 2});  // one of the two reloads is refused the first time
  swap.reset();
  EXPECT_EQ(device_->injected().copy, 1u);
  ASSERT_TRUE(a.storage().resident());
  ASSERT_TRUE(b.storage().resident());
  EXPECT_EQ(hash_now(a), expected_hash(2 * MiB, 5));
  EXPECT_EQ(hash_now(b), expected_hash(3 * MiB, 6));
  expect_host_books(0, 0);
}

TEST_F(SwapFaults, ShutdownThatCannotCopyGivesTheHostBuffersBackAndNeverFakesResidency) {
  auto swap = scheduler();
  auto a = tensor(2 * MiB, 7);
  ASSERT_EQ(swap->offload(a, 0, "layer0.attn"), SwapDecision::swapped);
  device_->synchronize();
  const std::int64_t before = allocated();
  device_->set_plan({.copy_every = 1});
  swap.reset();
  EXPECT_EQ(device_->injected().copy, 2u);                    // tried, and tried once more
  EXPECT_EQ(a.storage().state(), StorageState::swapped_out);  // no block of garbage behind the view
  EXPECT_EQ(allocated(), before);
  expect_host_books(0, 0);
}

// ---- the host pool alone ------------------------------------------------------------------

std::vector<HostPoolBackend> backends_here() {
  std::vector<HostPoolBackend> b{HostPoolBackend::builtin};
  if (jemalloc_in_process()) b.push_back(HostPoolBackend::jemalloc);
  return b;
}

class HostPoolPinFaults : public ::testing::TestWithParam<HostPoolBackend> {
 protected:
  void SetUp() override {
    EmulatedOptions o;
    o.capacity = 64 * MiB;
    device_ = std::make_unique<FaultInjectingDevice>(make_emulated_device(0, o), FaultPlan{});
    HostPoolOptions po;
    po.backend = GetParam();
    pool_ = std::make_unique<HostPool>(*device_, po);
  }
  void TearDown() override {
    device_->set_plan({});
    pool_.reset();
    EXPECT_EQ(device_->counters().pinned_host, 0u);
  }
  void expect_pins_match() { EXPECT_EQ(device_->counters().pinned_host, pool_->stats().pinned_bytes); }

  std::unique_ptr<FaultInjectingDevice> device_;
  std::unique_ptr<HostPool> pool_;
};

TEST_P(HostPoolPinFaults, EveryPinRefusedIsOutOfMemoryWithNothingChanged) {
  device_->set_plan({.pin_every = 1});
  try {
    pool_->allocate(3 * MiB);
    ADD_FAILURE() << "allocate succeeded with pinning refused";
  } catch (const OutOfMemory& e) {
    EXPECT_THAT(e.what(), HasSubstr("host pool: cannot allocate 3145728 bytes"));
  }
  const HostPoolStats s = pool_->stats();
  EXPECT_EQ(s.live_buffers, 0u);
  EXPECT_EQ(s.in_use_bytes, 0u);
  EXPECT_EQ(s.num_allocs, 0u);
  EXPECT_EQ(s.num_ooms, 1u);
  EXPECT_GE(device_->injected().pin, 2u);  // refused, and refused again after the retry
  expect_pins_match();

  device_->set_plan({});
  void* p = pool_->allocate(3 * MiB);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(device_->is_pinned(p));
  std::memset(p, 0x5A, 3 * MiB);
  expect_pins_match();
  pool_->deallocate(p);
  pool_->release_unused();
  EXPECT_EQ(pool_->stats().pinned_bytes, 0u);
  expect_pins_match();
}

TEST_P(HostPoolPinFaults, ASingleRefusalIsRetriedAndLiveBuffersKeepTheirBytes) {
  void* first = pool_->allocate(1 * MiB);
  pattern(first, 1 * MiB, 42);
  const std::uint64_t pins_before = device_->injected().pin;
  EXPECT_EQ(pins_before, 0u);
  // Every other pin refused, and the first one taken by someone else: the pool's next pin is
  // the refused one, its retry the next.
  device_->set_plan({.pin_every = 2});
  std::vector<char> other(4096);
  device_->pin_host(other.data(), other.size());
  void* big = nullptr;
  int ooms = 0;
  for (int i = 0; i < 4 && big == nullptr; ++i) {
    try {
      big = pool_->allocate(48 * MiB);  // more than any cached chunk: new pages, a new pin
    } catch (const OutOfMemory&) {
      ++ooms;
    }
  }
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(ooms, 0) << "a single refused pin surfaced instead of being retried";
  EXPECT_TRUE(device_->is_pinned(big));
  EXPECT_EQ(hash_bytes(first, 1 * MiB), expected_hash(1 * MiB, 42));
  EXPECT_EQ(pool_->stats().num_ooms, 0u);
  EXPECT_EQ(device_->injected().pin, 1u);
  device_->unpin_host(other.data());
  expect_pins_match();
  pool_->deallocate(big);
  pool_->deallocate(first);
  pool_->release_unused();
  expect_pins_match();
}

INSTANTIATE_TEST_SUITE_P(Backends, HostPoolPinFaults, ::testing::ValuesIn(backends_here()),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace stowage
