// What the C ABI offers framework shims and the Python package: tags, the snapshot as text,
// memory fractions, error kinds, device -1 for "the owner" / "every device", and DLPack export.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include <dlpack/dlpack.h>
#include <nlohmann/json.hpp>

#include "capi_json.hpp"
#include "stowage/stowage.h"

namespace {

constexpr ssize_t kMiB = 1 << 20;

std::string error() { return stowage_last_error(); }

nlohmann::json snapshot(int device) { return stowage::test::capi_json(stowage_snapshot_json, device); }

std::string tag_of(const nlohmann::json& snap, std::uintptr_t address) {
  for (const auto& s : snap.at("segments"))
    for (const auto& b : s.at("blocks"))
      if (b.at("address").get<std::uintptr_t>() == address && b.at("state") == "active_allocated") return b.at("tag");
  return "<no live block>";
}

std::int64_t allocated(int device) {
  std::string buf(1 << 16, '\0');
  EXPECT_GT(stowage_get_stats(device, buf.data(), buf.size()), 0);
  return nlohmann::json::parse(buf.c_str()).at("allocated_bytes.all.current");
}

TEST(CApiFramework, TagsNestPerThreadAndReachTheSnapshot) {
  ASSERT_EQ(stowage_push_tag("layer1"), 0);
  void* a = stowage_malloc(4096, 0, nullptr);
  ASSERT_EQ(stowage_push_tag("layer1.mlp"), 0);
  void* b = stowage_malloc(4096, 0, nullptr);
  ASSERT_EQ(stowage_pop_tag(), 0);
  void* c = stowage_malloc(4096, 0, nullptr);
  ASSERT_EQ(stowage_pop_tag(), 0);
  void* d = stowage_malloc(4096, 0, nullptr);
  EXPECT_EQ(stowage_pop_tag(), -1);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(error().find("no tag was pushed"), std::string::npos) << error();
  EXPECT_EQ(stowage_push_tag(nullptr), -1);
  const nlohmann::json snap = snapshot(0);
  EXPECT_EQ(tag_of(snap, reinterpret_cast<std::uintptr_t>(a)), "layer1");
  EXPECT_EQ(tag_of(snap, reinterpret_cast<std::uintptr_t>(b)), "layer1.mlp");
  EXPECT_EQ(tag_of(snap, reinterpret_cast<std::uintptr_t>(c)), "layer1");
  EXPECT_EQ(tag_of(snap, reinterpret_cast<std::uintptr_t>(d)), "");
  for (void* p : {a, b, c, d}) stowage_free(p, 4096, 0, nullptr);
  EXPECT_EQ(allocated(0), 0);
}

TEST(CApiFramework, SnapshotTextFollowsSnprintfsConvention) {
  const ssize_t n = stowage_snapshot_json(0, nullptr, 0);
  ASSERT_GT(n, 10);
  char small[8];
  EXPECT_EQ(stowage_snapshot_json(0, small, sizeof small), n);
  EXPECT_EQ(std::strlen(small), 7u);
  EXPECT_EQ(stowage_snapshot_json(0, nullptr, 5), -1);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_INVALID_ARGUMENT);
}

TEST(CApiFramework, MemoryFractionCapsAtAShareOfCapacity) {
  const ssize_t capacity = stowage_device_capacity(0);
  ASSERT_GT(capacity, 0) << error();
  ASSERT_EQ(stowage_empty_cache(0), 0);
  ASSERT_EQ(stowage_set_memory_fraction(0, 0.25), 0) << error();
  EXPECT_EQ(stowage_malloc(capacity / 4 + 64 * kMiB, 0, nullptr), nullptr);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(error().find("out of memory"), std::string::npos) << error();
  void* p = stowage_malloc(capacity / 8, 0, nullptr);
  EXPECT_NE(p, nullptr) << error();
  stowage_free(p, capacity / 8, 0, nullptr);
  for (double bad : {-0.5, 1.5, -1e-300}) {
    EXPECT_EQ(stowage_set_memory_fraction(0, bad), -1) << bad;
    EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_INVALID_ARGUMENT);
  }
  EXPECT_EQ(stowage_set_memory_cap(0, 0), 0);
  EXPECT_EQ(stowage_device_capacity(99), -1);
  EXPECT_EQ(stowage_empty_cache(0), 0);
}

TEST(CApiFramework, DeviceMinusOneMeansTheOwnerOrEveryDevice) {
  void* p = stowage_malloc(2 * kMiB, 0, nullptr);
  ASSERT_NE(p, nullptr) << error();
  EXPECT_EQ(stowage_record_stream(p, -1, nullptr), 0) << error();
  int on_stack = 0;
  EXPECT_EQ(stowage_record_stream(&on_stack, -1, nullptr), -1);
  EXPECT_NE(error().find("not a live stowage block"), std::string::npos) << error();
  stowage_free(p, 2 * kMiB, 0, nullptr);
  EXPECT_EQ(stowage_empty_cache(-1), 0) << error();
  std::string buf(1 << 16, '\0');
  ASSERT_GT(stowage_get_stats(0, buf.data(), buf.size()), 0);
  EXPECT_EQ(nlohmann::json::parse(buf.c_str()).at("reserved_bytes.all.current"), 0);
  EXPECT_EQ(stowage_empty_cache(-2), -1);
}

TEST(CApiFramework, DlpackExportOwnsItsBlockUntilTheDeleter) {
  const std::int64_t shape[] = {3, 5};
  DLManagedTensor* t = stowage_dlpack_empty(0, shape, 2, kDLBfloat, 16, nullptr);
  ASSERT_NE(t, nullptr) << error();
  EXPECT_EQ(t->dl_tensor.ndim, 2);
  EXPECT_EQ(t->dl_tensor.shape[0], 3);
  EXPECT_EQ(t->dl_tensor.shape[1], 5);
  EXPECT_EQ(t->dl_tensor.dtype.code, kDLBfloat);
  EXPECT_EQ(t->dl_tensor.dtype.bits, 16);
  EXPECT_EQ(t->dl_tensor.device.device_type, stowage_using_cuda() == 1 ? kDLCUDA : kDLCPU);
  EXPECT_EQ(allocated(0), 512);  // 30 bytes, rounded to the allocator's 512
  if (stowage_using_cuda() == 0) std::memset(t->dl_tensor.data, 0x3f, 30);
  t->deleter(t);
  EXPECT_EQ(allocated(0), 0);
  // Refused: a type without a stowage dtype, a negative or overflowing shape, a bad device.
  EXPECT_EQ(stowage_dlpack_empty(0, shape, 2, kDLComplex, 64, nullptr), nullptr);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_UNSUPPORTED);
  EXPECT_EQ(error().rfind("stowage_dlpack_empty: dtype code 5 with 64 bits", 0), 0u) << error();
  const std::int64_t negative[] = {4, -1};
  EXPECT_EQ(stowage_dlpack_empty(0, negative, 2, kDLFloat, 32, nullptr), nullptr);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_INVALID_ARGUMENT);
  const std::int64_t huge[] = {std::int64_t{1} << 40, std::int64_t{1} << 40};
  EXPECT_EQ(stowage_dlpack_empty(0, huge, 2, kDLFloat, 32, nullptr), nullptr);
  EXPECT_NE(error().find("overflows"), std::string::npos) << error();
  EXPECT_EQ(stowage_dlpack_empty(0, nullptr, 1, kDLFloat, 32, nullptr), nullptr);
  EXPECT_EQ(stowage_dlpack_empty(7, shape, 2, kDLFloat, 32, nullptr), nullptr);
  EXPECT_EQ(allocated(0), 0);
}

// A 0 anywhere in the shape makes an empty device tensor, whatever the other dimensions
// multiply to; a negative one is refused wherever it sits.
TEST(CApiFramework, DlpackEmptyWithAZeroDimensionAnywhereTakesNoMemory) {
  constexpr std::int64_t big = std::int64_t{1} << 62;
  const std::int64_t shapes[][3] = {{0, big, big}, {big, 0, big}, {big, big, 0}};
  for (const auto& shape : shapes) {
    DLManagedTensor* t = stowage_dlpack_empty(0, shape, 3, kDLFloat, 32, nullptr);
    ASSERT_NE(t, nullptr) << shape[0] << ", " << shape[1] << ", " << shape[2] << ": " << error();
    for (int i = 0; i < 3; ++i) EXPECT_EQ(t->dl_tensor.shape[i], shape[i]);
    EXPECT_EQ(allocated(0), 0);
    t->deleter(t);
  }
  const std::int64_t negative_after[] = {big, 0, -1};
  EXPECT_EQ(stowage_dlpack_empty(0, negative_after, 3, kDLFloat, 32, nullptr), nullptr);
  EXPECT_EQ(error(), "stowage_dlpack_empty: negative dimension -1");
  const std::int64_t overflow[] = {big, big, 1};
  EXPECT_EQ(stowage_dlpack_empty(0, overflow, 3, kDLFloat, 32, nullptr), nullptr);
  EXPECT_EQ(error(), "stowage_dlpack_empty: the tensor's size overflows");
}

TEST(CApiFramework, ASuccessfulCallClearsTheErrorCode) {
  EXPECT_EQ(stowage_malloc(-1, 0, nullptr), nullptr);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_GE(stowage_device_count(), 1);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_OK);
  EXPECT_EQ(error(), "");
}

}  // namespace
