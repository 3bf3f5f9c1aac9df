// The emulated device's clock: queued copies follow each other on the link without the host
// threads' hand-offs in between, one link per direction is shared by every stream, a stream that
// waits on an event goes on at the event's device time, and no copy ever beats the link.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <thread>
#include <vector>

#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"

namespace stowage {
namespace {

constexpr std::size_t kCopy = std::size_t{64} << 10;  // 65,536 ns per copy at 1 GB/s
constexpr double kCopyMs = kCopy / 1e6;               // bytes / (1 GB/s), in ms
constexpr int kCopies = 32;

std::unique_ptr<Device> device(double slack_ms) {
  EmulatedOptions o;
  o.capacity = std::size_t{64} << 20;
  o.link_bandwidth_gbps = 1.0;
  o.scheduling_slack_ms = slack_ms;
  return make_emulated_device(0, o);
}

// Holds a stream until released. Work queued behind it is all queued before it starts, so the
// device times below do not depend on how fast the host queued it.
class Gate {
 public:
  Gate(Device& d, Stream s) {
    d.launch_host(s, [this] {
      started_.set_value();
      open_.get_future().wait();
    });
    started_.get_future().wait();
  }
  void release() {
    // The gate's device time is its run time from when it was queued; the pause keeps that end
    // after every queue time above however late its thread started.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    open_.set_value();
  }

 private:
  std::promise<void> started_, open_;
};

struct Buffers {
  Buffers(Device& d, std::size_t bytes) : dev(d), host(bytes, 0x5a) {
    d.pin_host(host.data(), bytes);
    device = d.allocate(bytes);
  }
  ~Buffers() {
    dev.deallocate(device);
    dev.unpin_host(host.data());
  }
  char* h(int i) { return host.data() + i * kCopy; }
  char* d(int i) { return static_cast<char*>(device) + i * kCopy; }
  Device& dev;
  std::vector<char> host;
  void* device;
};

TEST(EmulatedClock, QueuedCopiesFollowEachOtherOnTheLinkWithoutGaps) {
  // A minute of slack: however the host schedules the stream thread, the device time is exact.
  auto dev = device(60'000);
  const Stream s = dev->create_stream();
  Buffers b(*dev, kCopies * kCopy);
  const Event start = dev->create_event(true), end = dev->create_event(true);
  Gate gate(*dev, s);
  dev->record(start, s);
  for (int i = 0; i < kCopies; ++i) dev->copy_async(b.d(i), b.h(i), kCopy, CopyKind::host_to_device, s);
  dev->record(end, s);
  gate.release();
  dev->synchronize(end);
  // Exactly the link's time for the bytes: no copy waited for the thread that ran the one before.
  EXPECT_NEAR(dev->elapsed_ms(start, end), kCopies * kCopyMs, 1e-3);
  dev->destroy_event(start);
  dev->destroy_event(end);
  dev->destroy_stream(s);
}

TEST(EmulatedClock, StreamsShareOneLinkPerDirectionAndWaitsGoOnAtTheEventsTime) {
  auto dev = device(60'000);
  const Stream g = dev->create_stream(), s1 = dev->create_stream(), s2 = dev->create_stream(),
               s3 = dev->create_stream();
  Buffers b(*dev, 3 * kCopies * kCopy);
  std::vector<Event> ev;
  for (int i = 0; i < 8; ++i) ev.push_back(dev->create_event(true));
  const Event go = ev[0], a1 = ev[1], b1 = ev[2], a2 = ev[3], b2 = ev[4], a3 = ev[5], b3 = ev[6], after = ev[7];
  Gate gate(*dev, g);
  dev->record(go, g);
  // s1 and s2 both copy host to device: one link, so together they take twice as long.
  // s3 copies device to host at the same time: the other direction's link, not slowed.
  dev->wait(s1, go);
  dev->wait(s2, go);
  dev->wait(s3, go);
  dev->record(a1, s1);
  dev->record(a2, s2);
  dev->record(a3, s3);
  for (int i = 0; i < kCopies; ++i) {
    dev->copy_async(b.d(i), b.h(i), kCopy, CopyKind::host_to_device, s1);
    dev->copy_async(b.d(kCopies + i), b.h(kCopies + i), kCopy, CopyKind::host_to_device, s2);
    dev->copy_async(b.h(2 * kCopies + i), b.d(2 * kCopies + i), kCopy, CopyKind::device_to_host, s3);
  }
  dev->record(b1, s1);
  dev->record(b2, s2);
  dev->record(b3, s3);
  // g goes on once s3 is done: its next record is at s3's end.
  dev->wait(g, b3);
  dev->record(after, g);
  gate.release();
  dev->synchronize();
  EXPECT_NEAR(dev->elapsed_ms(go, a1), 0.0, 1e-3) << "a waiting stream goes on at the event's time";
  EXPECT_NEAR(dev->elapsed_ms(go, a2), 0.0, 1e-3);
  EXPECT_NEAR(dev->elapsed_ms(go, a3), 0.0, 1e-3);
  const double h2d_last = std::max(dev->elapsed_ms(go, b1), dev->elapsed_ms(go, b2));
  const double h2d_first = std::min(dev->elapsed_ms(go, b1), dev->elapsed_ms(go, b2));
  EXPECT_NEAR(h2d_last, 2 * kCopies * kCopyMs, 1e-3) << "two streams' H2D copies share one link";
  EXPECT_GE(h2d_first, kCopies * kCopyMs - 1e-3) << "interleaved, the first stream cannot finish early";
  EXPECT_NEAR(dev->elapsed_ms(go, b3), kCopies * kCopyMs, 1e-3) << "D2H has its own link";
  EXPECT_NEAR(dev->elapsed_ms(b3, after), 0.0, 1e-3);
  for (Event e : ev) dev->destroy_event(e);
  for (Stream s : {g, s1, s2, s3}) dev->destroy_stream(s);
}

TEST(EmulatedClock, NoCopyBeatsTheLink) {
  // The default slack, and idle time first: time the link was idle is not banked.
  auto dev = device(EmulatedOptions{}.scheduling_slack_ms);
  const Stream s1 = dev->create_stream(), s2 = dev->create_stream();
  constexpr std::size_t kBytes = std::size_t{4} << 20;  // 4.19 ms at 1 GB/s
  std::vector<char> host(2 * kBytes);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<char>(i * 131);
  dev->pin_host(host.data(), host.size());
  void* d = dev->allocate(2 * kBytes);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const Event e1 = dev->create_event(true), e2 = dev->create_event(true), e0 = dev->create_event(true);
  const auto t0 = std::chrono::steady_clock::now();
  dev->record(e0, s1);
  dev->copy_async(d, host.data(), kBytes, CopyKind::host_to_device, s1);
  dev->copy_async(static_cast<char*>(d) + kBytes, host.data() + kBytes, kBytes, CopyKind::host_to_device, s2);
  dev->record(e1, s1);
  dev->record(e2, s2);
  dev->synchronize();
  const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const double bound = 2 * kBytes / 1e6;
  EXPECT_GE(wall, bound) << "8 MiB through a 1 GB/s link";
  EXPECT_GE(std::max(dev->elapsed_ms(e0, e1), dev->elapsed_ms(e0, e2)), bound - 1e-3);
  std::vector<char> back(2 * kBytes);
  dev->copy_async(back.data(), d, 2 * kBytes, CopyKind::device_to_host, s1);
  dev->synchronize(s1);
  EXPECT_EQ(std::memcmp(back.data(), host.data(), back.size()), 0);
  dev->deallocate(d);
  dev->unpin_host(host.data());
  for (Event e : {e0, e1, e2}) dev->destroy_event(e);
  dev->destroy_stream(s1);
  dev->destroy_stream(s2);
}

TEST(EmulatedClock, RejectsASlackThatIsNotADuration) {
  for (double bad : {-1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()})
    EXPECT_THROW(device(bad), InvalidArgument) << bad;
  EXPECT_NO_THROW(device(0.0));
}

// A link so slow that its copy times overflow the clock used to turn throttling off without a
// word; such rates, and capacities past what a process can address, are refused.
TEST(EmulatedClock, RejectsLinksAndCapacitiesOutOfRange) {
  for (double bad : {1e-300, 1e-4, -1.0, 1e9, std::numeric_limits<double>::quiet_NaN()}) {
    EmulatedOptions o;
    o.link_bandwidth_gbps = bad;
    EXPECT_THROW(make_emulated_device(0, o), InvalidArgument) << bad;
  }
  for (double good : {0.0, kMinLinkGbps, 32.0, kMaxLinkGbps}) {
    EmulatedOptions o;
    o.link_bandwidth_gbps = good;
    EXPECT_NO_THROW(make_emulated_device(0, o)) << good;
  }
  EmulatedOptions o;
  o.capacity = kMaxEmulatedCapacity + 1;
  EXPECT_THROW(make_emulated_device(0, o), InvalidArgument);
}

}  // namespace
}  // namespace stowage
