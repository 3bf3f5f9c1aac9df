// Owned streams and events: destroyed exactly once, by whoever holds them last.
#include <gtest/gtest.h>

#include <vector>

#include "stowage/device_handles.hpp"
#include "stowage/emulated_device.hpp"

namespace stowage {
namespace {

TEST(DeviceHandles, AStreamIsDestroyedWithItsOwnerAndOnlyOnce) {
  auto device = make_emulated_device(0);
  Stream raw{};
  {
    OwnedStream s(*device);
    raw = s;
    EXPECT_TRUE(s.owns());
    EXPECT_NE(raw, kDefaultStream);
    device->fill_async(nullptr, 0, 0, s);  // usable as a Stream
    OwnedStream moved = std::move(s);
    EXPECT_FALSE(s.owns());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
    EXPECT_EQ(moved.get(), raw);
    device->synchronize(moved);
  }
  // Gone: destroying it again is refused by the device.
  EXPECT_THROW(device->destroy_stream(raw), InvalidArgument);
}

TEST(DeviceHandles, AnEventIsDestroyedWithItsOwnerAndAssignmentReleasesTheOldOne) {
  auto device = make_emulated_device(0);
  OwnedEvent a(*device, true);
  const Event first = a;
  a = OwnedEvent(*device);
  EXPECT_NE(a.get(), first);
  EXPECT_THROW(device->destroy_event(first), InvalidArgument);
  const Event second = a;
  a.reset();
  EXPECT_FALSE(a.owns());
  EXPECT_THROW(device->destroy_event(second), InvalidArgument);
  a.reset();  // twice is harmless
}

TEST(DeviceHandles, HandlesInAContainerEachOwnTheirOwn) {
  auto device = make_emulated_device(0);
  std::vector<Stream> raws;
  {
    std::vector<OwnedStream> streams;
    for (int i = 0; i < 5; ++i) {
      streams.emplace_back(*device);
      raws.push_back(streams.back());
    }
  }
  for (Stream s : raws) EXPECT_THROW(device->destroy_stream(s), InvalidArgument);
}

}  // namespace
}  // namespace stowage
