// DLPack export and import: a round trip sees the same bytes, shape and strides; the deleter
// keeps the storage alive and runs exactly once.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/cuda_device.hpp"
#include "stowage/dlpack.hpp"
#include "stowage/emulated_device.hpp"

namespace stowage {
namespace {

class DLPackTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> device = make_emulated_device(0, EmulatedOptions{.capacity = 64 << 20});
  CachingAllocator allocator{*device};
};

TensorView iota_tensor(CachingAllocator& a, std::vector<std::int64_t> shape) {
  TensorView t = TensorView::empty(a, DType::i32, std::move(shape));
  std::iota(t.data_as<std::int32_t>(), t.data_as<std::int32_t>() + t.numel(), 100);
  return t;
}

TEST_F(DLPackTest, ExportDescribesTheView) {
  TensorView t = iota_tensor(allocator, {4, 6}).slice(1, 2, 5);
  DLManagedTensor* m = to_dlpack(t);
  const DLTensor& d = m->dl_tensor;
  EXPECT_EQ(d.device.device_type, kDLCPU);  // emulated device memory is host memory
  EXPECT_EQ(d.device.device_id, 0);
  EXPECT_EQ(d.dtype.code, kDLInt);
  EXPECT_EQ(d.dtype.bits, 32);
  EXPECT_EQ(d.dtype.lanes, 1);
  ASSERT_EQ(d.ndim, 2);
  EXPECT_EQ(d.shape[0], 4);
  EXPECT_EQ(d.shape[1], 3);
  EXPECT_EQ(d.strides[0], 6);
  EXPECT_EQ(d.strides[1], 1);
  EXPECT_EQ(static_cast<char*>(d.data) + d.byte_offset, t.data());
  EXPECT_EQ(static_cast<std::int32_t*>(d.data)[0], 102);
  EXPECT_EQ(static_cast<std::int32_t*>(d.data)[6 + 1], 109);
  m->deleter(m);
}

TEST_F(DLPackTest, DeleterKeepsStorageAliveAfterViewsGo) {
  DLManagedTensor* m = nullptr;
  const std::int64_t before = allocator.stats().allocated_bytes.all.current;
  std::int64_t block = 0;
  {
    TensorView t = iota_tensor(allocator, {1000});
    block = static_cast<std::int64_t>(allocator.block_size(t.data()));
    EXPECT_GE(block, 4000);
    m = to_dlpack(t);
    EXPECT_EQ(t.storage().use_count(), 2);  // the view and the DLPack context
  }
  // The only owner now is the DLPack tensor: the block is still allocated and intact.
  EXPECT_EQ(allocator.stats().allocated_bytes.all.current, before + block);
  EXPECT_EQ(static_cast<std::int32_t*>(m->dl_tensor.data)[999], 1099);
  m->deleter(m);
  EXPECT_EQ(allocator.stats().allocated_bytes.all.current, before);
}

TEST_F(DLPackTest, RoundTripSharesBytesAndCallsTheDeleterOnce) {
  TensorView t = iota_tensor(allocator, {3, 4, 5});
  const auto before = allocator.stats().allocation.all.current;
  TensorView back = from_dlpack(to_dlpack(t.slice(2, 1, 4)), *device);
  EXPECT_EQ(back.dtype(), DType::i32);
  EXPECT_EQ(back.shape(), (std::vector<std::int64_t>{3, 4, 3}));
  EXPECT_EQ(back.strides(), (std::vector<std::int64_t>{20, 5, 1}));
  EXPECT_EQ(back.data(), static_cast<std::int32_t*>(t.data()) + 1);  // no copy
  EXPECT_EQ(back.data_as<std::int32_t>()[2 * 20 + 3 * 5 + 2], 100 + 2 * 20 + 3 * 5 + 3);
  // The imported storage spans exactly the bytes the view reaches.
  EXPECT_EQ(back.storage().nbytes(), (2u * 20 + 3 * 5 + 2 + 1) * 4);
  EXPECT_EQ(back.storage().resource(), nullptr);
  EXPECT_EQ(t.storage().use_count(), 2);  // t and the DLPack context inside `back`
  back.data_as<std::int32_t>()[0] = -7;   // writes land in the original
  EXPECT_EQ(t.data_as<std::int32_t>()[1], -7);
  TensorView copy = back;
  back = TensorView();
  EXPECT_EQ(t.storage().use_count(), 2);  // `copy` still holds the import
  copy = TensorView();
  EXPECT_EQ(t.storage().use_count(), 1);  // deleter ran: the export context is gone
  EXPECT_EQ(allocator.stats().allocation.all.current, before);
}

struct ForeignTensor {
  std::vector<float> data;
  std::vector<std::int64_t> shape, strides;
  DLManagedTensor managed{};
  int* deleted;
  static void deleter(DLManagedTensor* self) {
    auto* f = static_cast<ForeignTensor*>(self->manager_ctx);
    ++*f->deleted;
    delete f;
  }
};

DLManagedTensor* foreign(int* deleted, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides,
                         std::size_t n, DLDataType dtype = {kDLFloat, 32, 1}) {
  auto* f = new ForeignTensor{std::vector<float>(n), std::move(shape), std::move(strides), {}, deleted};
  std::iota(f->data.begin(), f->data.end(), 0.0f);
  f->managed.dl_tensor = {f->data.data(),
                          {kDLCPU, 0},
                          static_cast<std::int32_t>(f->shape.size()),
                          dtype,
                          f->shape.data(),
                          f->strides.empty() ? nullptr : f->strides.data(),
                          0};
  f->managed.manager_ctx = f;
  f->managed.deleter = &ForeignTensor::deleter;
  return &f->managed;
}

TEST_F(DLPackTest, ImportsForeignCpuTensorsWithNullOrNegativeStrides) {
  int deleted = 0;
  {
    TensorView a = from_dlpack(foreign(&deleted, {2, 3}, {}, 6), *device);
    EXPECT_EQ(a.strides(), (std::vector<std::int64_t>{3, 1}));
    EXPECT_EQ(a.data_as<float>()[4], 4.0f);
    // A reversed view: data points at the last float, stride -1.
    DLManagedTensor* m = foreign(&deleted, {6}, {-1}, 6);
    m->dl_tensor.byte_offset = 5 * sizeof(float);
    TensorView r = from_dlpack(m, *device);
    EXPECT_EQ(r.data_as<float>()[0], 5.0f);
    EXPECT_EQ(r.byte_offset(), 20u);
    EXPECT_EQ(r.storage().nbytes(), 24u);
    EXPECT_EQ(deleted, 0);
  }
  EXPECT_EQ(deleted, 2);
}

// A 0 anywhere in an imported shape gives an empty view, whatever the other dimensions multiply
// to; an empty tensor made here exports and comes back the same.
TEST_F(DLPackTest, AZeroDimensionAnywhereIsAnEmptyTensor) {
  constexpr std::int64_t big = std::int64_t{1} << 62;
  int deleted = 0;
  for (const std::vector<std::int64_t>& shape :
       {std::vector<std::int64_t>{0, big, big}, {big, 0, big}, {big, big, 0}}) {
    TensorView v = from_dlpack(foreign(&deleted, shape, {}, 0), *device);
    EXPECT_EQ(v.numel(), 0);
    EXPECT_EQ(v.nbytes(), 0u);
    EXPECT_EQ(v.storage().nbytes(), 0u);
    TensorView made = TensorView::empty(allocator, DType::f32, shape);
    EXPECT_EQ(made.numel(), 0);
    TensorView back = from_dlpack(to_dlpack(made), *device);
    EXPECT_EQ(back.shape(), shape);
  }
  EXPECT_EQ(deleted, 3);
}

TEST_F(DLPackTest, RejectedImportsLeaveOwnershipWithTheCaller) {
  int deleted = 0;
  DLManagedTensor* lanes = foreign(&deleted, {4}, {}, 4, {kDLFloat, 32, 4});
  EXPECT_THROW(from_dlpack(lanes, *device), Unsupported);
  DLManagedTensor* complex = foreign(&deleted, {2}, {}, 4, {kDLComplex, 64, 1});
  EXPECT_THROW(from_dlpack(complex, *device), Unsupported);
  DLManagedTensor* cuda = foreign(&deleted, {4}, {}, 4);
  cuda->dl_tensor.device = {kDLCUDA, 0};
  EXPECT_THROW(from_dlpack(cuda, *device), InvalidArgument);  // not a CUDA device
  DLManagedTensor* negative = foreign(&deleted, {-2}, {}, 4);
  EXPECT_THROW(from_dlpack(negative, *device), InvalidArgument);
  EXPECT_THROW(from_dlpack(nullptr, *device), InvalidArgument);
  // Extents past the address space are refused, not computed in overflowing int64 arithmetic
  // (UBSan's signed-overflow finding): 2^62 floats, and two floats 2^62 elements apart.
  constexpr std::int64_t big = std::int64_t{1} << 62;
  DLManagedTensor* huge = foreign(&deleted, {big}, {}, 4);
  EXPECT_THROW(from_dlpack(huge, *device), InvalidArgument);
  DLManagedTensor* apart = foreign(&deleted, {2}, {big}, 4);
  EXPECT_THROW(from_dlpack(apart, *device), InvalidArgument);
  DLManagedTensor* below = foreign(&deleted, {2, 2}, {-big, -big}, 4);
  EXPECT_THROW(from_dlpack(below, *device), InvalidArgument);
  EXPECT_EQ(deleted, 0);
  for (auto* m : {lanes, complex, cuda, negative, huge, apart, below}) m->deleter(m);
  EXPECT_EQ(deleted, 7);
}

TEST_F(DLPackTest, EveryDTypeMapsBothWays) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i8, DType::i16, DType::i32, DType::i64,
                  DType::u8, DType::u16, DType::boolean}) {
    TensorView v = TensorView::empty(allocator, t, {8});
    TensorView back = from_dlpack(to_dlpack(v), *device);
    EXPECT_EQ(back.dtype(), t) << to_string(t);
    EXPECT_EQ(back.data(), v.data());
  }
}

TEST_F(DLPackTest, ReleasedStorageCannotBeExported) {
  TensorView t = TensorView::empty(allocator, DType::f32, {16});
  t.storage().release();
  EXPECT_THROW(to_dlpack(t), InvalidArgument);
  EXPECT_EQ(t.storage().use_count(), 1);
}

TEST(DLPackCuda, ExportsCudaMemoryAsKDLCUDAAndRoundTrips) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  auto device = make_cuda_device(0);
  CachingAllocator allocator(*device);
  TensorView t = TensorView::empty(allocator, DType::i32, {4, 8});
  std::vector<std::int32_t> host(32), back_host(32, 0);
  std::iota(host.begin(), host.end(), 7);
  device->copy_async(t.data(), host.data(), 128, CopyKind::host_to_device, kDefaultStream);
  DLManagedTensor* m = to_dlpack(t.slice(0, 1, 3));
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(m->dl_tensor.device.device_id, device->ordinal());
  TensorView back = from_dlpack(m, *device);
  EXPECT_EQ(back.data(), static_cast<std::int32_t*>(t.data()) + 8);
  device->copy_async(back_host.data(), back.data(), back.nbytes(), CopyKind::device_to_host, kDefaultStream);
  device->synchronize(kDefaultStream);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(back_host[i], 15 + i);
  EXPECT_EQ(t.storage().use_count(), 2);
  back = TensorView();
  EXPECT_EQ(t.storage().use_count(), 1);
}

}  // namespace
}  // namespace stowage
