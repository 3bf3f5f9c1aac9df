// Lifetimes on the allocator layer: an allocator (or device resource) must not outlive its
// device. Destroying the device first used to crash in the allocator's destructor (it
// synchronised a device that was gone); now the device's destruction ends the process at once
// with a message naming both.
#include <gtest/gtest.h>

#include <memory>

#include "allocator_test_util.hpp"
#include "stowage/caching_allocator.hpp"
#include "stowage/device_resource.hpp"

namespace stowage {
namespace {

using test::MiB;

class AllocatorLifetime : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(AllocatorLifetime, ADeviceDestroyedBeforeItsAllocatorEndsTheProcessNamingBoth) {
  EXPECT_DEATH(
      {
        auto device = test::small_device(64 * MiB);
        auto allocator = std::make_shared<CachingAllocator>(*device);
        (void)allocator->allocate(4096);
        device.reset();
        allocator.reset();
      },
      "stowage: fatal: device 0 \\(emulated.*\\) destroyed while 1 object\\(s\\) made on it still live: "
      "CachingAllocator 0x[0-9a-f]+");
  EXPECT_DEATH(
      {
        auto device = test::small_device(64 * MiB);
        auto plain = std::make_unique<DeviceResource>(*device);
        device.reset();
      },
      "destroyed while 1 object\\(s\\) made on it still live: DeviceResource 0x[0-9a-f]+");
}

TEST_F(AllocatorLifetime, InTheRightOrderNothingIsSaid) {
  auto device = test::small_device(64 * MiB);
  {
    CachingAllocator allocator(*device);
    DeviceResource plain(*device);
    void* p = allocator.allocate(4096);
    allocator.deallocate(p);
  }
  EXPECT_EXIT(
      {
        auto d = test::small_device(64 * MiB);
        auto a = std::make_unique<CachingAllocator>(*d);
        (void)a->allocate(MiB);  // a live block is a leak the log reports, not a lifetime error
        a.reset();
        d.reset();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace stowage
