// The C ABI's pinned host pool: stowage_host_malloc / free, the DLPack export of its memory, its
// statistics, and every bad input refused with the pool unchanged.
#include <gtest/gtest.h>

#include <dlpack/dlpack.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "capi_json.hpp"
#include "stowage/stowage.h"

namespace {

constexpr ssize_t kMiB = 1 << 20;

std::string error() { return stowage_last_error(); }

nlohmann::json host_stats(int device) { return stowage::test::capi_json(stowage_host_stats, device); }

TEST(CApiHost, PoolMemoryIsHostMemoryCountedInThePoolsStatistics) {
  const nlohmann::json before = host_stats(0);
  auto* p = static_cast<unsigned char*>(stowage_host_malloc(kMiB + 3, 0));
  ASSERT_NE(p, nullptr) << error();
  std::memset(p, 0xa5, kMiB + 3);  // the host's own memory, whatever the device
  EXPECT_EQ(p[kMiB + 2], 0xa5);
  const nlohmann::json live = host_stats(0);
  EXPECT_EQ(live.at("live_buffers"), before.at("live_buffers").get<int>() + 1);
  EXPECT_EQ(live.at("requested_bytes"), before.at("requested_bytes").get<std::int64_t>() + kMiB + 3);
  EXPECT_GE(live.at("in_use_bytes").get<std::int64_t>() - before.at("in_use_bytes").get<std::int64_t>(), kMiB + 3);
  EXPECT_GE(live.at("pinned_bytes").get<std::int64_t>(), live.at("in_use_bytes").get<std::int64_t>());
  EXPECT_EQ(live.at("num_allocs"), before.at("num_allocs").get<int>() + 1);

  EXPECT_EQ(stowage_host_free(p, 0), 0) << error();
  const nlohmann::json after = host_stats(0);
  EXPECT_EQ(after.at("live_buffers"), before.at("live_buffers"));
  EXPECT_EQ(after.at("requested_bytes"), before.at("requested_bytes"));
  EXPECT_EQ(after.at("num_frees"), before.at("num_frees").get<int>() + 1);
  // Nothing live: every pinned page goes back.
  const auto pinned = after.at("pinned_bytes").get<ssize_t>();
  EXPECT_EQ(stowage_host_release_unused(0), pinned) << error();
  EXPECT_EQ(host_stats(0).at("pinned_bytes"), 0);
}

TEST(CApiHost, BadInputIsRefusedAndChangesNothing) {
  void* p = stowage_host_malloc(4096, 0);
  ASSERT_NE(p, nullptr) << error();
  const nlohmann::json before = host_stats(0);

  EXPECT_EQ(stowage_host_malloc(-1, 0), nullptr);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(error().find("negative size -1"), std::string::npos) << error();
  EXPECT_EQ(stowage_host_malloc(0, 0), nullptr);  // nothing asked, nothing wrong
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_OK);
  EXPECT_EQ(stowage_host_malloc(std::int64_t{1} << 50, 0), nullptr);  // a size, just none the host has
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_OUT_OF_MEMORY) << error();
  EXPECT_EQ(stowage_host_malloc(64, stowage_device_count()), nullptr);  // one past the last device
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_INVALID_ARGUMENT);

  int on_the_stack = 0;
  EXPECT_EQ(stowage_host_free(&on_the_stack, 0), -1);
  EXPECT_NE(error().find("not a live buffer of this pool"), std::string::npos) << error();
  EXPECT_EQ(stowage_host_free(nullptr, 0), 0);
  EXPECT_EQ(stowage_host_stats(0, nullptr, 8), -1);
  nlohmann::json now = host_stats(0);
  EXPECT_EQ(now.at("num_ooms"), before.at("num_ooms").get<int>() + 1);  // the 2^50 one, as any refusal
  now["num_ooms"] = before.at("num_ooms");
  EXPECT_EQ(now, before);

  EXPECT_EQ(stowage_host_free(p, 0), 0) << error();
  EXPECT_EQ(stowage_host_free(p, 0), -1);  // twice
  EXPECT_NE(error().find("double free"), std::string::npos) << error();
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(host_stats(0).at("live_buffers"), before.at("live_buffers").get<int>() - 1);
}

// A size below the pool's limit that this host still lacks (twice its physical memory) is refused
// before a page is touched: faulting it in would bring the kernel's OOM killer.
TEST(CApiHost, MoreThanTheHostHasIsOutOfMemoryNotAKill) {
  const auto physical = static_cast<std::int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  ASSERT_LT(2 * physical, std::int64_t{1} << 46);  // below the 64 TiB no host has
  const nlohmann::json before = host_stats(0);
  EXPECT_EQ(stowage_host_malloc(2 * physical, 0), nullptr);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_OUT_OF_MEMORY) << error();
  EXPECT_NE(error().find("bytes available"), std::string::npos) << error();
  // Counted as a refusal; nothing handed out (the retry may have given cached pages back first).
  const nlohmann::json now = host_stats(0);
  EXPECT_EQ(now.at("num_ooms"), before.at("num_ooms").get<int>() + 1);
  for (const char* key : {"live_buffers", "in_use_bytes", "requested_bytes", "num_allocs"})
    EXPECT_EQ(now.at(key), before.at(key)) << key;
  void* p = stowage_host_malloc(kMiB, 0);  // the pool goes on
  ASSERT_NE(p, nullptr) << error();
  EXPECT_EQ(stowage_host_free(p, 0), 0) << error();
}

TEST(CApiHost, DlpackExportIsRowMajorHostDataGivenBackByItsDeleter) {
  const nlohmann::json before = host_stats(0);
  const std::int64_t shape[] = {4, 3, 5};
  DLManagedTensor* t = stowage_dlpack_host_empty(0, shape, 3, kDLFloat, 32);
  ASSERT_NE(t, nullptr) << error();
  const DLTensor& d = t->dl_tensor;
  EXPECT_EQ(d.device.device_type, kDLCPU);
  EXPECT_EQ(d.ndim, 3);
  EXPECT_EQ(d.dtype.code, kDLFloat);
  EXPECT_EQ(d.dtype.bits, 32);
  EXPECT_EQ(d.shape[0], 4);
  EXPECT_EQ(d.shape[2], 5);
  EXPECT_EQ(d.strides[0], 15);
  EXPECT_EQ(d.strides[1], 5);
  EXPECT_EQ(d.strides[2], 1);
  EXPECT_EQ(d.byte_offset, 0u);
  auto* f = static_cast<float*>(d.data);
  for (int i = 0; i < 60; ++i) f[i] = static_cast<float>(i);
  EXPECT_EQ(f[59], 59.0F);
  EXPECT_EQ(host_stats(0).at("requested_bytes"), before.at("requested_bytes").get<std::int64_t>() + 240);
  t->deleter(t);
  EXPECT_EQ(host_stats(0).at("requested_bytes"), before.at("requested_bytes"));
  EXPECT_EQ(host_stats(0).at("live_buffers"), before.at("live_buffers"));

  // Refused before anything is taken: a type without a stowage dtype, bad shapes, a bad device.
  EXPECT_EQ(stowage_dlpack_host_empty(0, shape, 3, kDLComplex, 64), nullptr);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_UNSUPPORTED);
  EXPECT_EQ(error().rfind("stowage_dlpack_host_empty: dtype code 5 with 64 bits", 0), 0u) << error();
  const std::int64_t negative[] = {4, -1};
  EXPECT_EQ(stowage_dlpack_host_empty(0, negative, 2, kDLFloat, 32), nullptr);
  EXPECT_NE(error().find("negative dimension -1"), std::string::npos) << error();
  const std::int64_t huge[] = {std::int64_t{1} << 40, std::int64_t{1} << 40};
  EXPECT_EQ(stowage_dlpack_host_empty(0, huge, 2, kDLFloat, 32), nullptr);
  EXPECT_NE(error().find("overflows"), std::string::npos) << error();
  // 2^63 bytes fits a size_t but no int64 byte count: an overflow here as on the device, not OOM.
  const std::int64_t past_int64[] = {std::int64_t{1} << 62, 2};
  EXPECT_EQ(stowage_dlpack_host_empty(0, past_int64, 2, kDLInt, 8), nullptr);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_INVALID_ARGUMENT) << error();
  EXPECT_EQ(stowage_dlpack_empty(0, past_int64, 2, kDLInt, 8, nullptr), nullptr);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_INVALID_ARGUMENT) << error();
  EXPECT_EQ(stowage_dlpack_host_empty(0, nullptr, 1, kDLFloat, 32), nullptr);
  EXPECT_EQ(stowage_dlpack_host_empty(stowage_device_count(), shape, 3, kDLFloat, 32), nullptr);
  EXPECT_EQ(host_stats(0).at("num_allocs"), before.at("num_allocs").get<int>() + 1);
}

TEST(CApiHost, PoolBuffersHaveTheDeviceAddressTheKernelsUse) {
  void* p = stowage_host_malloc(4096, 0);
  ASSERT_NE(p, nullptr) << error();
  // Emulated devices and CUDA GPUs that address registered memory by its host pointer (the
  // machines stowage.torch's mapped state runs on) give the same address.
  void* addr = stowage_host_device_pointer(p, 0);
  ASSERT_NE(addr, nullptr) << error();
  if (stowage_using_cuda() == 0) EXPECT_EQ(addr, p);
  int on_the_stack = 0;
  EXPECT_EQ(stowage_host_device_pointer(&on_the_stack, 0), nullptr);
  EXPECT_NE(error().find("is not a live buffer of device 0's host pool"), std::string::npos) << error();
  EXPECT_EQ(stowage_host_free(p, 0), 0) << error();
  EXPECT_EQ(stowage_host_device_pointer(p, 0), nullptr);  // given back
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_INVALID_ARGUMENT);
}

TEST(CApiHost, AnEmptyTensorNamesAnyDimensionsWithoutOverflow) {
  const std::int64_t shape[] = {0, std::int64_t{1} << 62, std::int64_t{1} << 62};
  DLManagedTensor* t = stowage_dlpack_host_empty(0, shape, 3, kDLFloat, 32);
  ASSERT_NE(t, nullptr) << error();
  EXPECT_EQ(t->dl_tensor.data, nullptr);  // no bytes
  EXPECT_EQ(t->dl_tensor.strides[2], 1);
  t->deleter(t);
}

// A 0 anywhere in the shape makes an empty tensor, whatever the other dimensions multiply to:
// the size check used to stop at their overflow when the 0 came after them.
TEST(CApiHost, AZeroDimensionAnywhereGivesAnEmptyTensor) {
  constexpr std::int64_t big = std::int64_t{1} << 62;
  const std::int64_t shapes[][3] = {{0, big, big}, {big, 0, big}, {big, big, 0}};
  const nlohmann::json before = host_stats(0);
  for (const auto& shape : shapes) {
    DLManagedTensor* t = stowage_dlpack_host_empty(0, shape, 3, kDLFloat, 32);
    ASSERT_NE(t, nullptr) << shape[0] << ", " << shape[1] << ", " << shape[2] << ": " << error();
    EXPECT_EQ(t->dl_tensor.data, nullptr);  // no bytes
    for (int i = 0; i < 3; ++i) EXPECT_EQ(t->dl_tensor.shape[i], shape[i]);
    t->deleter(t);
  }
  EXPECT_EQ(host_stats(0).at("requested_bytes"), before.at("requested_bytes"));
  // A negative dimension is refused wherever it sits beside the 0.
  const std::int64_t negative_after[] = {big, 0, -1}, negative_before[] = {-1, big, 0};
  for (const std::int64_t* shape : {negative_after, negative_before}) {
    EXPECT_EQ(stowage_dlpack_host_empty(0, shape, 3, kDLFloat, 32), nullptr);
    EXPECT_EQ(error(), "stowage_dlpack_host_empty: negative dimension -1");
  }
  const std::int64_t overflow[] = {big, big, 1};
  EXPECT_EQ(stowage_dlpack_host_empty(0, overflow, 3, kDLFloat, 32), nullptr);
  EXPECT_EQ(error(), "stowage_dlpack_host_empty: the tensor's size overflows");
}

}  // namespace
