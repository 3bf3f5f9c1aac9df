// An emulated device used in a process forked from the one that made it: its streams are worker
// threads that fork() does not copy and its memory is the parent's, so every operation there is
// refused with an error that names fork() (stream work used to wait for ever), destroying it (or
// its streams and events) works, the parent's mapped memory cannot be written from the child,
// and the parent goes on as before.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "fork_test_util.hpp"
#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/error.hpp"

namespace stowage {
namespace {

constexpr std::size_t kGranule = std::size_t{2} << 20;

using test::in_child;
using test::refusals;

TEST(EmulatedFork, EveryOperationIsRefusedInAForkedChildAndDestroyingWorks) {
  auto dev = make_emulated_device(0, EmulatedOptions{.capacity = 64 << 20});
  const Stream s = dev->create_stream(0);
  const Stream other = dev->create_stream(0);
  const Event e = dev->create_event(false);
  const Event done = dev->create_event(false);
  auto* block = static_cast<unsigned char*>(dev->allocate(4096));
  std::memset(block, 0x5A, 4096);
  dev->record(done, s);
  dev->synchronize(s);
  // Work in flight at the fork: the event's record is queued behind it, and in the child nothing
  // will ever run it.
  dev->launch_host(s, [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); });
  dev->record(e, s);
  void* va = dev->reserve(kGranule);
  const PhysicalHandle chunk = dev->create_physical(kGranule);

  const int status = in_child([&] {
    unsigned char byte = 0;
    const int code = refusals({
        [&] { dev->synchronize(s); },
        [&] { dev->synchronize(); },
        [&] { dev->copy_async(&byte, block, 1, CopyKind::device_to_host, s); },
        [&] { dev->fill_async(block, 0, 1, s); },
        [&] { dev->launch_host(s, [] {}); },
        [&] { dev->record(e, s); },
        [&] { dev->wait(s, e); },
        [&] { dev->query(e); },  // would stay false for ever
        [&] { dev->synchronize(e); },
        [&] { dev->elapsed_ms(done, e); },
        [&] { dev->check_stream(s); },
        [&] { dev->create_stream(0); },
        [&] { dev->create_event(false); },
        [&] { dev->allocate(4096); },
        [&] { dev->deallocate(block); },
        [&] { dev->map(va, kGranule, chunk); },
        [&] { dev->unmap(va, kGranule); },
        [&] { dev->set_access(va, kGranule); },
        [&] { dev->reserve(kGranule); },
        [&] { dev->unreserve(va, kGranule); },
        [&] { dev->create_physical(kGranule); },
        [&] { dev->destroy_physical(chunk); },
        [&] { dev->export_handle(chunk); },
        [&] { dev->pin_host(&byte, 1); },
        [&] { dev->unpin_host(&byte); },
    });
    if (code != 0) return code;
    // Destroying works: a stream, an event, the device (each keeps what the parent's threads
    // still wait on instead of destroying it, and takes no lock they might have held).
    dev->destroy_stream(other);
    dev->destroy_event(e);
    dev.reset();
    return 0;
  });
  EXPECT_EQ(status, 0);
  // The parent's streams are untouched: its work runs and its event completes.
  dev->synchronize(s);
  EXPECT_TRUE(dev->query(e));
  EXPECT_EQ(block[0], 0x5A);
  dev->destroy_physical(chunk);
  dev->unreserve(va, kGranule);
  dev->destroy_event(e);
  dev->destroy_event(done);
  dev->deallocate(block);
  dev->destroy_stream(s);
  dev->destroy_stream(other);
}

TEST(EmulatedFork, AChildCannotWriteTheParentsMappedMemory) {
  // Mapped chunks are shared memory: a child's copy of the mapping would write the parent's. The
  // child has no such mapping (mincore says ENOMEM: nothing is mapped there), while memory the
  // device allocated privately is the child's own copy.
  auto dev = make_emulated_device(0, EmulatedOptions{.capacity = 64 << 20});
  void* va = dev->reserve(kGranule);
  const PhysicalHandle chunk = dev->create_physical(kGranule);
  dev->map(va, kGranule, chunk);
  dev->set_access(va, kGranule);
  static_cast<unsigned char*>(va)[0] = 0x5A;
  void* own = dev->allocate(4096);
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  auto mapped = [page](void* p) {
    unsigned char resident = 0;
    return ::mincore(p, page, &resident) == 0;
  };
  ASSERT_TRUE(mapped(va));
  const int status = in_child([&] {
    if (mapped(va)) return 1;
    return mapped(own) ? 0 : 2;
  });
  EXPECT_EQ(status, 0);
  EXPECT_EQ(static_cast<unsigned char*>(va)[0], 0x5A);
  dev->deallocate(own);
  dev->unmap(va, kGranule);
  dev->destroy_physical(chunk);
  dev->unreserve(va, kGranule);
}

TEST(EmulatedFork, ADeviceMadeInTheChildWorksThere) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer cannot start threads after a multi-threaded fork() (it exits the child with 66)";
#endif
  auto parent = make_emulated_device(0, EmulatedOptions{.capacity = 64 << 20});
  test::wait_for_other_threads_to_sleep();  // the parent device's worker has started
  const int status = in_child([] {
    auto dev = make_emulated_device(1, EmulatedOptions{.capacity = 64 << 20});
    const Stream s = dev->create_stream(0);
    auto* block = static_cast<unsigned char*>(dev->allocate(4096));
    unsigned char host = 0x11;
    dev->copy_async(block, &host, 1, CopyKind::host_to_device, s);
    dev->synchronize(s);
    const int code = block[0] == 0x11 ? 0 : 1;
    dev->deallocate(block);
    dev->destroy_stream(s);
    return code;
  });
  EXPECT_EQ(status, 0);
}

}  // namespace
}  // namespace stowage
