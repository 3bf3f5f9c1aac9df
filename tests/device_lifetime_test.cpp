// Lifetimes on the device layer: objects made on a device register with it (Device::attach), and
// a device destroyed while one is registered ends the process with a message naming both, rather
// than leaving the object with streams and memory that are gone (stowage/dependents.hpp).
#include <gtest/gtest.h>

#include <memory>
#include <utility>

#include "stowage/dependents.hpp"
#include "stowage/device_handles.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/fault_injection.hpp"

namespace stowage {
namespace {

class DeviceLifetime : public ::testing::Test {
 protected:
  // The emulated device runs worker threads: the death test's child must start afresh.
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(DeviceLifetime, DependenciesCountWhileTheyLiveAndMoveWithTheirHolder) {
  Dependents owner;
  EXPECT_EQ(owner.count(), 0u);
  Dependency a = owner.add("owner", "a");
  Dependency b = owner.add("owner", "b");
  EXPECT_EQ(owner.count(), 2u);
  Dependency moved = std::move(a);
  EXPECT_FALSE(a.active());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_TRUE(moved.active());
  EXPECT_EQ(owner.count(), 2u);
  b = std::move(moved);  // b's own registration ends; moved's lives on in b
  EXPECT_EQ(owner.count(), 1u);
  b.reset();
  EXPECT_EQ(owner.count(), 0u);
  owner.check_none_left();  // nothing left: returns
}

TEST_F(DeviceLifetime, AnOwnerDestroyedBeforeADependentEndsTheProcessNamingBoth) {
  EXPECT_DEATH(
      {
        auto owner = std::make_unique<Dependents>();
        Dependency d = owner->add("the owner", "the dependent");
        owner.reset();
      },
      "stowage: fatal: the owner destroyed while 1 object\\(s\\) made on it still live: the dependent");
}

TEST_F(DeviceLifetime, StreamsAndEventsAttachToTheirDevice) {
  auto device = make_emulated_device(0);
  {
    OwnedStream s(*device);
    OwnedEvent e(*device);
    OwnedStream moved = std::move(s);
    Dependency mine = device->attach("a test object");
    (void)mine;
  }
  // Everything detached: the device goes quietly (EXPECT_EXIT would see an abort otherwise).
  EXPECT_EXIT(
      {
        auto d = make_emulated_device(0);
        { OwnedStream s(*d); }
        d.reset();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(DeviceLifetime, ADeviceDestroyedBeforeAStreamHandleEndsTheProcessNamingBoth) {
  EXPECT_DEATH(
      {
        auto device = make_emulated_device(3);
        OwnedStream s(*device);
        device.reset();
      },
      "stowage: fatal: device 3 \\(emulated.*\\) destroyed while 1 object\\(s\\) made on it still live: "
      "OwnedStream \\(stream [0-9]+\\).*Lifetimes");
  EXPECT_DEATH(
      {
        auto device = make_emulated_device(0);
        OwnedEvent e(*device);
        Dependency mine = device->attach("my object");
        device.reset();
      },
      "device 0 .* destroyed while 2 object\\(s\\) .*OwnedEvent \\(event [0-9]+\\), my object");
}

TEST_F(DeviceLifetime, AFaultInjectingDeviceChecksItsOwnDependents) {
  EXPECT_DEATH(
      {
        auto device = std::make_unique<FaultInjectingDevice>(make_emulated_device(0), FaultPlan{});
        OwnedStream s(*device);
        device.reset();
      },
      "destroyed while 1 object\\(s\\) made on it still live: OwnedStream");
}

}  // namespace
}  // namespace stowage
