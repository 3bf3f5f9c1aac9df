// The recompute registry on a device that refuses allocations, mappings or copies while
// rematerialising: before_backward reports it, the registration stays (released, nothing half
// done), and once the device works again the same call recomputes the bit-identical activation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "recompute_test_util.hpp"
#include "stowage/activations.hpp"
#include "stowage/fault_injection.hpp"
#include "stowage/recompute.hpp"

namespace stowage {
namespace {

using namespace stowage::testing;
using ::testing::HasSubstr;

// A little over 2 MiB of f32: a whole expandable granule or more, so that after empty_cache()
// bringing it back has to ask the device.
const std::vector<std::int64_t> kShape{520, 1024};

// Emulated only: it checks free_memory() == capacity at the end, exact on the emulated device alone.
class RecomputeFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    dev_ = std::make_unique<FaultInjectingDevice>(small_device(), FaultPlan{});
    alloc_ = std::make_unique<CachingAllocator>(*dev_);
    stream_ = dev_->create_stream();
  }
  void TearDown() override {
    dev_->set_plan({});
    dev_->synchronize();
    alloc_.reset();
    dev_->destroy_stream(stream_);
    EXPECT_EQ(dev_->free_memory(), dev_->capacity());
  }
  TensorView input(unsigned seed) {
    auto x = TensorView::empty(*alloc_, DType::f32, kShape, stream_);
    upload(*dev_, x, normal_values(static_cast<std::size_t>(x.numel()), seed, 2.0f), stream_);
    return x;
  }
  // Reuses freed bytes for junk, so a rematerialised tensor cannot inherit its old contents.
  void scribble(std::size_t nbytes) {
    auto junk = TensorView::empty(*alloc_, DType::u8, {static_cast<std::int64_t>(nbytes)}, stream_);
    dev_->fill_async(junk.data(), 0xAB, nbytes, stream_);
    dev_->synchronize(stream_);
  }
  RecomputeOptions opts(int prefetch_distance = 0) {
    RecomputeOptions o;
    o.compute_stream = stream_;
    o.prefetch_distance = prefetch_distance;
    return o;
  }
  std::int64_t allocated() const { return alloc_->stats().allocated_bytes.all.current; }

  std::unique_ptr<FaultInjectingDevice> dev_;
  std::unique_ptr<CachingAllocator> alloc_;
  Stream stream_{};
};

RecomputeFn gelu() {
  return
      [](const RecomputeContext& c) { activation_forward(Activation::gelu_erf, c.inputs[0], c.outputs[0], c.stream); };
}

TEST_F(RecomputeFaults, RefusedReallocationIsOutOfMemoryAndARetryRecomputesBitIdentical) {
  for (const FaultPlan plan : {FaultPlan{.allocation_every = 1}, FaultPlan{.map_every = 1}}) {
    Recompute rc(*alloc_, opts());
    auto x = input(1);
    auto y = rc.forward(2, "mlp.act", {x}, {{DType::f32, kShape}}, gelu())[0];
    const auto forward_hash = fnv1a(download(*dev_, y, stream_));
    ASSERT_EQ(rc.release(2), y.nbytes());
    scribble(y.nbytes());
    alloc_->empty_cache();
    const std::int64_t before = allocated();
    const FaultCounts injected_before = dev_->injected();

    dev_->set_plan(plan);
    try {
      rc.before_backward(2);
      ADD_FAILURE() << "rematerialised with the device refusing memory";
    } catch (const OutOfMemory& e) {
      EXPECT_THAT(e.what(), HasSubstr("stowage: out of memory"));
      EXPECT_THAT(e.what(), HasSubstr("cause: injected"));
    }
    const FaultCounts injected = dev_->injected();
    // The attempt and the allocator's retry; a refused mapping is tried twice in each.
    EXPECT_EQ(injected.allocation + injected.map - injected_before.allocation - injected_before.map,
              plan.map_every != 0 ? 4u : 2u);
    // The registration is intact and still released; nothing was allocated.
    EXPECT_EQ(y.storage().state(), StorageState::released);
    EXPECT_TRUE(rc.released(2));
    ASSERT_EQ(rc.entries().size(), 1u);
    EXPECT_EQ(rc.entries()[0].state, StorageState::released);
    EXPECT_EQ(rc.stats().rematerializations, 0u);
    EXPECT_EQ(rc.stats().released_bytes_now, y.nbytes());
    EXPECT_EQ(allocated(), before);

    dev_->set_plan({});
    rc.before_backward(2);
    EXPECT_EQ(y.storage().state(), StorageState::resident);
    EXPECT_EQ(fnv1a(download(*dev_, y, stream_)), forward_hash);
    EXPECT_EQ(rc.stats().rematerializations, 1u);
    rc.after_backward(2);
  }
}

TEST_F(RecomputeFaults, AFunctionThatFailsLeavesItsOutputReleasedNotGarbage) {
  Recompute rc(*alloc_, opts());
  auto x = input(2);
  // A "kernel" that is a device copy: the copy engine refuses it while recomputing.
  RecomputeFn copy = [](const RecomputeContext& c) {
    c.device.copy_async(c.outputs[0].data(), c.inputs[0].data(), c.outputs[0].nbytes(), CopyKind::device_to_device,
                        c.stream);
  };
  auto y = rc.forward(4, "copy", {x}, {{DType::f32, kShape}}, copy)[0];
  const auto forward_hash = fnv1a(download(*dev_, y, stream_));
  ASSERT_EQ(rc.release(4), y.nbytes());
  const std::int64_t before = allocated();

  dev_->set_plan({.copy_every = 1});
  EXPECT_THROW(rc.before_backward(4), DeviceError);
  EXPECT_EQ(y.storage().state(), StorageState::released);  // not resident with bytes never computed
  EXPECT_TRUE(rc.released(4));
  EXPECT_EQ(rc.stats().rematerializations, 0u);
  EXPECT_EQ(allocated(), before);

  dev_->set_plan({});
  scribble(y.nbytes());  // the block the failed attempt had gets junk before the retry
  rc.before_backward(4);
  EXPECT_EQ(fnv1a(download(*dev_, y, stream_)), forward_hash);
  EXPECT_EQ(rc.stats().rematerializations, 1u);
}

TEST_F(RecomputeFaults, APrefetchedLayerThatFindsNoMemoryIsLeftForItsOwnHook) {
  Recompute rc(*alloc_, opts(1));
  auto x = input(3);
  auto y4 = rc.forward(4, "mlp.act", {x}, {{DType::f32, kShape}}, gelu())[0];
  auto y3 = rc.forward(3, "mlp.act", {x}, {{DType::f32, kShape}}, gelu())[0];
  const auto hash4 = fnv1a(download(*dev_, y4, stream_));
  const auto hash3 = fnv1a(download(*dev_, y3, stream_));
  ASSERT_EQ(rc.release(4), y4.nbytes());
  ASSERT_EQ(rc.release(3), y3.nbytes());
  alloc_->empty_cache();
  scribble(y4.nbytes());  // leaves exactly one cached block of that size: layer 4 gets it

  dev_->set_plan({.allocation_every = 1});
  rc.before_backward(4);  // layer 4 from the cache; layer 3 (prefetched) needs the device
  EXPECT_EQ(y4.storage().state(), StorageState::resident);
  EXPECT_EQ(y3.storage().state(), StorageState::released);
  EXPECT_EQ(rc.stats().prefetches_deferred, 1u);
  EXPECT_EQ(dev_->injected().allocation, 2u);
  EXPECT_EQ(fnv1a(download(*dev_, y4, stream_)), hash4);
  rc.after_backward(4);

  dev_->set_plan({});
  rc.before_backward(3);
  EXPECT_EQ(fnv1a(download(*dev_, y3, stream_)), hash3);
  EXPECT_EQ(rc.stats().rematerializations, 2u);
}

}  // namespace
}  // namespace stowage
