// The fault-injecting adaptor fails exactly every Nth call of a kind, and the device keeps
// working (and keeps its data) afterwards.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "stowage/emulated_device.hpp"
#include "stowage/fault_injection.hpp"

namespace stowage {
namespace {

std::unique_ptr<FaultInjectingDevice> make(FaultPlan plan) {
  EmulatedOptions o;
  o.capacity = 64 << 20;
  return std::make_unique<FaultInjectingDevice>(make_emulated_device(0, o), plan);
}

TEST(FaultPlan, Parses) {
  auto p = parse_fault_plan("alloc=7,map=5,pin=3,copy=11,record=13");
  EXPECT_EQ(p.allocation_every, 7u);
  EXPECT_EQ(p.map_every, 5u);
  EXPECT_EQ(p.pin_every, 3u);
  EXPECT_EQ(p.copy_every, 11u);
  EXPECT_EQ(p.record_every, 13u);
  EXPECT_TRUE(parse_fault_plan("record=2").any());
  EXPECT_FALSE(parse_fault_plan("").any());
}

TEST(FaultPlan, RejectsMalformed) {
  EXPECT_THROW(parse_fault_plan("alloc"), ParseError);
  EXPECT_THROW(parse_fault_plan("alloc=x"), ParseError);
  EXPECT_THROW(parse_fault_plan("alloc=3z"), ParseError);
  EXPECT_THROW(parse_fault_plan("disk=3"), ParseError);
}

// The adaptor's streams are its device's: destroying one through either counts in both epochs.
TEST(FaultInjectingDevice, SharesTheStreamEpochOfItsDevice) {
  auto dev = make({});
  const Stream s = dev->create_stream();
  dev->destroy_stream(s);
  EXPECT_EQ(dev->stream_epoch(), 1u);
  EXPECT_EQ(dev->inner().stream_epoch(), 1u);
  const Stream t = dev->inner().create_stream();
  dev->inner().destroy_stream(t);
  EXPECT_EQ(dev->stream_epoch(), 2u);
}

TEST(FaultInjectingDevice, EveryThirdAllocationFailsAndNothingLeaks) {
  auto dev = make({.allocation_every = 3});
  std::vector<void*> got;
  int failures = 0;
  for (int i = 1; i <= 9; ++i) {
    try {
      got.push_back(dev->allocate(4096));
    } catch (const OutOfMemory& e) {
      EXPECT_EQ(i % 3, 0) << "call " << i;
      EXPECT_NE(std::string(e.what()).find("injected allocation fault"), std::string::npos);
      ++failures;
    }
  }
  EXPECT_EQ(failures, 3);
  EXPECT_EQ(got.size(), 6u);
  EXPECT_EQ(dev->injected().allocation, 3u);
  EXPECT_EQ(dev->counters().raw_allocated, 6u * 4096);
  for (void* p : got) dev->deallocate(p);
  EXPECT_EQ(dev->free_memory(), dev->capacity());
}

TEST(FaultInjectingDevice, FailedCopyLeavesDestinationUntouched) {
  auto dev = make({.copy_every = 2});
  std::vector<unsigned char> src(1 << 16, 0xAB), dst(1 << 16, 0x11);
  void* d = dev->allocate(src.size());
  dev->copy_async(d, src.data(), src.size(), CopyKind::host_to_device, kDefaultStream);  // call 1
  EXPECT_THROW(dev->copy_async(dst.data(), d, dst.size(), CopyKind::device_to_host, kDefaultStream),
               DeviceError);  // call 2
  dev->synchronize(kDefaultStream);
  EXPECT_EQ(dst[0], 0x11);
  dev->copy_async(dst.data(), d, dst.size(), CopyKind::device_to_host, kDefaultStream);  // call 3
  dev->synchronize(kDefaultStream);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size()), 0);
  dev->deallocate(d);
}

TEST(FaultInjectingDevice, MapAndPinFaults) {
  auto dev = make({.map_every = 2, .pin_every = 1});
  const std::size_t g = dev->properties().granularity;
  void* va = dev->reserve(4 * g);  // map-kind call 1
  auto h = dev->create_physical(g);
  EXPECT_THROW(dev->map(va, g, h, 0), DeviceError);   // call 2
  dev->map(va, g, h, 0);                              // call 3
  EXPECT_THROW(dev->set_access(va, g), DeviceError);  // call 4
  dev->set_access(va, g);                             // call 5
  std::memset(va, 1, g);
  dev->unmap(va, g);
  dev->destroy_physical(h);
  dev->unreserve(va, 4 * g);
  std::vector<char> host(4096);
  EXPECT_THROW(dev->pin_host(host.data(), host.size()), DeviceError);
  EXPECT_FALSE(dev->is_pinned(host.data()));
  EXPECT_EQ(dev->injected().map, 2u);
  EXPECT_EQ(dev->injected().pin, 1u);
  EXPECT_EQ(dev->free_memory(), dev->capacity());
}

TEST(FaultInjectingDevice, RefusedRecordLeavesTheEventAtItsEarlierPoint) {
  auto dev = make({.record_every = 2});
  const Stream s = dev->create_stream();
  const Event e = dev->create_event();
  dev->record(e, s);  // call 1
  dev->synchronize(e);
  // Work queued behind a host function that waits for a flag: the refused record must not have
  // moved the event behind it.
  std::atomic<bool> go{false};
  dev->launch_host(s, [&] {
    while (!go.load()) std::this_thread::yield();
  });
  EXPECT_THROW(dev->record(e, s), DeviceError);  // call 2
  EXPECT_TRUE(dev->query(e));
  dev->record(e, s);  // call 3: now behind the host function
  EXPECT_FALSE(dev->query(e));
  go = true;
  dev->synchronize(e);
  EXPECT_TRUE(dev->query(e));
  EXPECT_EQ(dev->injected().record, 1u);
  dev->destroy_event(e);
  dev->destroy_stream(s);
}

}  // namespace
}  // namespace stowage
