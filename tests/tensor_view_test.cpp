// TensorView over wrapped storage: shapes, strides, bounds, reshape/slice/view_as, ownership.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "stowage/emulated_device.hpp"
#include "stowage/tensor.hpp"

namespace stowage {
namespace {

class TensorViewTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> device = make_emulated_device(0, EmulatedOptions{.capacity = 64 << 20});
  std::vector<float> host = [] {
    std::vector<float> v(24);
    std::iota(v.begin(), v.end(), 0.0f);
    return v;
  }();
  int deleted = 0;
  Storage wrapped() {
    return Storage::wrap(*device, host.data(), host.size() * sizeof(float), [this] { ++deleted; });
  }
};

TEST_F(TensorViewTest, DTypeSizesAndNames) {
  EXPECT_EQ(itemsize(DType::f32), 4u);
  EXPECT_EQ(itemsize(DType::bf16), 2u);
  EXPECT_EQ(itemsize(DType::f64), 8u);
  EXPECT_EQ(itemsize(DType::i64), 8u);
  EXPECT_EQ(itemsize(DType::u16), 2u);
  EXPECT_EQ(itemsize(DType::boolean), 1u);
  EXPECT_STREQ(to_string(DType::bf16), "bf16");
  EXPECT_STREQ(to_string(DType::boolean), "bool");
}

TEST_F(TensorViewTest, ContiguousShapeStridesAndData) {
  TensorView t(wrapped(), DType::f32, {2, 3, 4});
  EXPECT_EQ(t.strides(), (std::vector<std::int64_t>{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.data(), host.data());
  EXPECT_EQ(t.data_as<float>()[13], 13.0f);
}

TEST_F(TensorViewTest, ScalarAndEmptyShapes) {
  TensorView scalar(wrapped(), DType::f32, {}, {}, 8);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(*scalar.data_as<float>(), 2.0f);
  TensorView empty(wrapped(), DType::f32, {0, 5}, {}, 96);  // zero elements at the very end
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.nbytes(), 0u);
  EXPECT_TRUE(empty.is_contiguous());
}

TEST_F(TensorViewTest, OutOfBoundsViewsAreRejected) {
  Storage s = wrapped();
  EXPECT_THROW(TensorView(s, DType::f32, {25}), InvalidArgument);
  EXPECT_THROW(TensorView(s, DType::f32, {24}, {}, 4), InvalidArgument);
  EXPECT_THROW(TensorView(s, DType::f32, {4}, {}, 2), InvalidArgument);       // misaligned
  EXPECT_THROW(TensorView(s, DType::f32, {3, 2}, {12, 1}), InvalidArgument);  // last element 2*12+1 = 25
  EXPECT_THROW(TensorView(s, DType::f32, {2, 3}, {1}), InvalidArgument);      // stride count
  EXPECT_THROW(TensorView(s, DType::f32, {-1}), InvalidArgument);
  EXPECT_THROW(TensorView(s, DType::f32, {2}, {-1}, 0), InvalidArgument);  // reaches below byte 0
  EXPECT_THROW(TensorView(Storage{}, DType::f32, {1}), InvalidArgument);
  // An extent past 2^63 bytes is named as it is (it was printed wrapped, as a range inside the storage).
  try {
    TensorView(s, DType::f32, {2}, {std::int64_t{1} << 62});
    ADD_FAILURE() << "a view reaching byte 2^64 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("reaches bytes [0, 18446744073709551620) of a 96-byte storage"));
  }
  try {
    TensorView(s, DType::f32, {2}, {-(std::int64_t{1} << 62)}, 4);
    ADD_FAILURE() << "a view reaching byte -2^64 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("reaches bytes [-18446744073709551612, 8)"));
  }
  // Negative strides inside the storage are fine: a reversed view of the first 4 floats.
  TensorView reversed(s, DType::f32, {4}, {-1}, 12);
  EXPECT_EQ(reversed.data_as<float>()[0], 3.0f);
  EXPECT_EQ(s.use_count(), 2);  // the rejected views kept no handle
}

TEST_F(TensorViewTest, ReshapeSharesStorage) {
  TensorView t(wrapped(), DType::f32, {2, 3, 4});
  TensorView r = t.reshape({6, -1});
  EXPECT_EQ(r.shape(), (std::vector<std::int64_t>{6, 4}));
  EXPECT_EQ(r.strides(), (std::vector<std::int64_t>{4, 1}));
  EXPECT_TRUE(r.storage().same_as(t.storage()));
  EXPECT_EQ(r.data_as<float>()[5 * 4 + 3], 23.0f);
  EXPECT_THROW(t.reshape({5, 5}), InvalidArgument);
  EXPECT_THROW(t.reshape({-1, -1}), InvalidArgument);
  EXPECT_THROW(t.slice(2, 0, 2).reshape({12}), InvalidArgument);  // not contiguous
}

TEST_F(TensorViewTest, SliceOffsetsAndStrides) {
  TensorView t(wrapped(), DType::f32, {2, 3, 4});
  TensorView s = t.slice(1, 1, 3);  // rows 1..2 of each matrix
  EXPECT_EQ(s.shape(), (std::vector<std::int64_t>{2, 2, 4}));
  EXPECT_EQ(s.strides(), (std::vector<std::int64_t>{12, 4, 1}));
  EXPECT_EQ(s.byte_offset(), 16u);
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.data_as<float>()[0], 4.0f);
  TensorView col = t.slice(-1, 2, 3);
  EXPECT_EQ(col.shape(), (std::vector<std::int64_t>{2, 3, 1}));
  EXPECT_EQ(col.data_as<float>()[12 + 4], 18.0f);  // t[1][1][2]
  EXPECT_THROW(t.slice(3, 0, 1), InvalidArgument);
  EXPECT_THROW(t.slice(0, 1, 3), InvalidArgument);
  EXPECT_THROW(t.slice(0, 2, 1), InvalidArgument);
}

TEST_F(TensorViewTest, ViewAsReinterpretsTheLastDimension) {
  TensorView t(wrapped(), DType::f32, {2, 12});
  TensorView halves = t.view_as(DType::bf16);
  EXPECT_EQ(halves.shape(), (std::vector<std::int64_t>{2, 24}));
  EXPECT_EQ(halves.strides(), (std::vector<std::int64_t>{24, 1}));
  std::uint32_t bits;
  std::memcpy(&bits, &host[1], 4);  // 1.0f = 0x3F800000, little-endian: high half second
  EXPECT_EQ(halves.data_as<std::uint16_t>()[3], bits >> 16);
  EXPECT_EQ(halves.data_as<std::uint16_t>()[2], bits & 0xFFFF);
  TensorView doubles = t.view_as(DType::f64);
  EXPECT_EQ(doubles.shape(), (std::vector<std::int64_t>{2, 6}));
  EXPECT_EQ(doubles.strides(), (std::vector<std::int64_t>{6, 1}));
  EXPECT_THROW(t.slice(1, 0, 3).view_as(DType::f64), InvalidArgument);  // 12 bytes per row
  EXPECT_THROW(TensorView(wrapped(), DType::f32, {}).view_as(DType::f64), InvalidArgument);
  EXPECT_EQ(t.view_as(DType::i32).dtype(), DType::i32);
}

TEST_F(TensorViewTest, WrappedDeleterRunsOnceWhenTheLastHandleGoes) {
  {
    TensorView a(wrapped(), DType::f32, {24});
    TensorView b = a.slice(0, 4, 8);
    TensorView c = b.reshape({2, 2});
    EXPECT_EQ(a.storage().use_count(), 3);
    EXPECT_EQ(a.storage().resource(), nullptr);
    EXPECT_EQ(&a.storage().device(), device.get());
    EXPECT_THROW(a.storage().release(), InvalidArgument);  // wrapped bytes cannot move
    EXPECT_TRUE(a.storage().resident());
  }
  EXPECT_EQ(deleted, 1);
}

}  // namespace
}  // namespace stowage
