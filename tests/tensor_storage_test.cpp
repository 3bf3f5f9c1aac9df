// Storage from the caching allocator: ownership, release / materialize / adopt, tags, and that
// bad calls change neither the storage nor the allocator's statistics.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>

#include "stowage/allocator.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/tensor.hpp"

namespace stowage {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

class StorageTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> device = make_emulated_device(0, EmulatedOptions{.capacity = 64 * kMiB});
  CachingAllocator allocator{*device};
  std::int64_t allocated() const { return allocator.stats().allocated_bytes.all.current; }
  std::int64_t live() const { return allocator.stats().allocation.all.current; }
};

TEST_F(StorageTest, AllocatedStorageGivesItsBytesBackWithTheLastHandle) {
  {
    Storage s = Storage::allocate(allocator, 10000);
    EXPECT_TRUE(s.valid());
    EXPECT_TRUE(s.resident());
    EXPECT_NE(s.data(), nullptr);
    EXPECT_EQ(s.nbytes(), 10000u);
    EXPECT_EQ(s.resource(), &allocator);
    EXPECT_EQ(&s.device(), device.get());
    EXPECT_EQ(s.stream(), kDefaultStream);
    EXPECT_TRUE(allocator.owns(s.data()));
    EXPECT_EQ(live(), 1);
    EXPECT_EQ(allocator.stats().requested_bytes.all.current, 10000);
    Storage copy = s;
    EXPECT_EQ(s.use_count(), 2);
    EXPECT_TRUE(copy.same_as(s));
    EXPECT_EQ(copy.id(), s.id());
  }
  EXPECT_EQ(live(), 0);
  EXPECT_EQ(allocated(), 0);
}

TEST_F(StorageTest, ZeroBytesIsAResidentEmptyStorage) {
  Storage s = Storage::allocate(allocator, 0);
  EXPECT_TRUE(s.resident());
  EXPECT_EQ(s.data(), nullptr);
  EXPECT_EQ(live(), 0);
  TensorView v(s, DType::f32, {0});
  EXPECT_EQ(v.data(), nullptr);
}

TEST_F(StorageTest, ReleaseAndMaterializeKeepViewsValid) {
  TensorView t = TensorView::empty(allocator, DType::f32, {256, 256});
  TensorView row = t.slice(0, 10, 11);
  const std::int64_t block = allocated();
  EXPECT_GE(block, 256 * 256 * 4);
  t.storage().release();
  EXPECT_EQ(t.storage().state(), StorageState::released);
  EXPECT_EQ(row.storage().state(), StorageState::released);  // same handle
  EXPECT_EQ(t.storage().data(), nullptr);
  EXPECT_EQ(t.storage().nbytes(), 256u * 256 * 4);
  EXPECT_EQ(allocated(), 0);
  EXPECT_THROW(row.data(), InvalidArgument);

  t.storage().materialize(kDefaultStream);
  EXPECT_TRUE(row.storage().resident());
  EXPECT_EQ(allocated(), block);
  row.data_as<float>()[3] = 42.0f;  // views address the new bytes
  EXPECT_EQ(t.data_as<float>()[10 * 256 + 3], 42.0f);
}

TEST_F(StorageTest, SwappedOutIsAReleasedStateToo) {
  Storage s = Storage::allocate(allocator, 4096);
  s.release(StorageState::swapped_out);
  EXPECT_EQ(s.state(), StorageState::swapped_out);
  EXPECT_STREQ(to_string(s.state()), "swapped_out");
  EXPECT_EQ(allocated(), 0);
}

TEST_F(StorageTest, BadTransitionsChangeNothing) {
  Storage s = Storage::allocate(allocator, 4096);
  void* data = s.data();
  const auto before = allocator.stats();
  EXPECT_THROW(s.materialize(kDefaultStream), InvalidArgument);  // already resident
  EXPECT_THROW(s.adopt(data, kDefaultStream), InvalidArgument);
  EXPECT_THROW(s.release(StorageState::resident), InvalidArgument);
  EXPECT_EQ(s.data(), data);
  EXPECT_EQ(allocator.stats().allocation.all.allocated, before.allocation.all.allocated);
  EXPECT_EQ(allocated(), before.allocated_bytes.all.current);

  s.release();
  EXPECT_THROW(s.release(), InvalidArgument);  // already released
  EXPECT_EQ(s.state(), StorageState::released);
  EXPECT_EQ(allocator.stats().allocation.all.freed, before.allocation.all.freed + 1);
  EXPECT_THROW(Storage().nbytes(), InvalidArgument);
}

TEST_F(StorageTest, AdoptTakesABlockFromTheSameAllocator) {
  Storage s = Storage::allocate(allocator, 8192);
  s.release();
  int local = 0;
  EXPECT_THROW(s.adopt(&local, kDefaultStream), InvalidArgument);  // foreign
  void* small = allocator.allocate(1024);
  EXPECT_THROW(s.adopt(small, kDefaultStream), InvalidArgument);  // too small
  EXPECT_EQ(s.state(), StorageState::released);
  allocator.deallocate(small);

  void* p = allocator.allocate(8192);
  std::memset(p, 0x5A, 8192);
  s.adopt(p, kDefaultStream);
  EXPECT_TRUE(s.resident());
  EXPECT_EQ(s.data(), p);
  EXPECT_EQ(static_cast<unsigned char*>(s.data())[8191], 0x5A);
  EXPECT_EQ(live(), 1);
  s = Storage();  // the adopted block goes back with the storage
  EXPECT_EQ(live(), 0);
}

TEST_F(StorageTest, MaterializeOutOfMemoryLeavesTheStorageReleased) {
  Storage s = Storage::allocate(allocator, 40 * kMiB);
  s.release();
  void* hog = allocator.allocate(40 * kMiB);  // 80 MiB would not fit in 64
  EXPECT_THROW(s.materialize(kDefaultStream), OutOfMemory);
  EXPECT_EQ(s.state(), StorageState::released);
  EXPECT_EQ(s.data(), nullptr);
  allocator.deallocate(hog);
  s.materialize(kDefaultStream);
  EXPECT_TRUE(s.resident());
}

TEST_F(StorageTest, ReleaseOnAnotherStreamRecordsThatStream) {
  const Stream side = device->create_stream();
  Storage s = Storage::allocate(allocator, 4096, side);
  EXPECT_EQ(s.stream(), side);
  s.release();
  s.materialize(kDefaultStream);
  EXPECT_EQ(s.stream(), kDefaultStream);
  s = Storage();
  device->synchronize();
  allocator.empty_cache();
  device->destroy_stream(side);
}

TEST_F(StorageTest, AllocationCarriesTheScopedTag) {
  Storage tagged;
  {
    ScopedTag tag("layer3.attn");
    tagged = Storage::allocate(allocator, 4096);
  }
  Storage untagged = Storage::allocate(allocator, 4096);
  int found = 0;
  for (const auto& seg : allocator.snapshot().segments)
    for (const auto& b : seg.blocks)
      if (b.state == BlockState::active_allocated) {
        if (b.address == reinterpret_cast<std::uintptr_t>(tagged.data())) {
          EXPECT_EQ(b.tag, "layer3.attn");
          ++found;
        } else if (b.address == reinterpret_cast<std::uintptr_t>(untagged.data())) {
          EXPECT_EQ(b.tag, "");
          ++found;
        }
      }
  EXPECT_EQ(found, 2);
}

// A tag belongs to the thread that made it: destroyed on another, it would leave its thread's
// current tag naming freed memory (the next ScopedTag::current() there crashed). Diagnosed.
TEST_F(StorageTest, ATagDestroyedOnAnotherThreadEndsTheProcessSayingSo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto tag = std::make_unique<ScopedTag>("layer7.mlp");
        std::thread([&] { tag.reset(); }).join();
        (void)ScopedTag::current();
      },
      "stowage: fatal: ScopedTag \"layer7.mlp\" destroyed on another thread than the one that made it");
  // On its own thread, in any order, it is fine.
  auto outer = std::make_unique<ScopedTag>("outer");
  auto inner = std::make_unique<ScopedTag>("inner");
  outer.reset();
  EXPECT_EQ(ScopedTag::current(), "inner");
  inner.reset();
  EXPECT_EQ(ScopedTag::current(), "");
}

TEST_F(StorageTest, EmptyTensorsMatchTheirShape) {
  TensorView t = TensorView::empty(allocator, DType::bf16, {3, 5, 7});
  EXPECT_EQ(t.storage().nbytes(), 3u * 5 * 7 * 2);
  EXPECT_EQ(t.strides(), (std::vector<std::int64_t>{35, 7, 1}));
  EXPECT_THROW(TensorView::empty(allocator, DType::f32, {2, -3}), InvalidArgument);
  EXPECT_THROW(TensorView::empty(allocator, DType::f64, {std::int64_t{1} << 40, std::int64_t{1} << 30}),
               InvalidArgument);
  EXPECT_EQ(live(), 1);
}

}  // namespace
}  // namespace stowage
