// The backend table: every backend of the build is listed once, the emulated one last (the
// fallback), found by name and kind, and opens devices of its kind with its own options.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "stowage/backends.hpp"
#include "stowage/cuda_device.hpp"

namespace stowage {
namespace {

TEST(Backends, EachIsListedOnceWithTheEmulatedFallbackLast) {
  const auto all = backends();
  ASSERT_GE(all.size(), 2u);
  std::set<std::string> names;
  for (const Backend& b : all) {
    EXPECT_TRUE(names.insert(b.name).second) << b.name;
    EXPECT_EQ(find_backend(b.name), &b);
    EXPECT_EQ(&backend_of(b.kind), &b);
    EXPECT_STREQ(to_string(b.kind), b.name);
    EXPECT_EQ(b.accelerator, b.kind != DeviceKind::emulated) << b.name;
  }
  EXPECT_EQ(all.back().kind, DeviceKind::emulated);
  EXPECT_EQ(find_backend("tpu"), nullptr);
  EXPECT_EQ(backend_names(), "cuda, emulated");
}

TEST(Backends, TheEmulatedBackendOpensDevicesWithItsOptions) {
  BackendOptions o;
  o.emulated.capacity = std::size_t{96} << 20;
  auto d = find_backend("emulated")->open(3, o);
  EXPECT_EQ(d->kind(), DeviceKind::emulated);
  EXPECT_EQ(d->ordinal(), 3);
  EXPECT_EQ(d->capacity(), std::size_t{96} << 20);
  EXPECT_TRUE(d->properties().host_accessible);
  EXPECT_EQ(d->properties().dlpack_device_type, 1);  // kDLCPU: host memory to consumers
}

TEST(Backends, CudaCountsAndExplainsTheSameAsItsOwnEntryPoints) {
  const Backend& cuda = backend_of(DeviceKind::cuda);
  EXPECT_EQ(cuda.device_count(), cuda_device_count());
  if (cuda.device_count() == 0) {
    EXPECT_EQ(cuda.unavailable_reason(), cuda_unavailable_reason());
    EXPECT_FALSE(cuda.unavailable_reason().empty());
    EXPECT_THROW(cuda.open(0, {}), Unsupported);
  } else {
    auto d = cuda.open(0, {});
    EXPECT_EQ(d->kind(), DeviceKind::cuda);
    EXPECT_EQ(d->properties().dlpack_device_type, 2);  // kDLCUDA
  }
}

}  // namespace
}  // namespace stowage
