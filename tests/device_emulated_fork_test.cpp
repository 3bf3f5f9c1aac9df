// An emulated device used in a process forked from the one that made it: its streams are worker
// threads that fork() does not copy, so stream work there is refused with an error that says so
// (it used to wait for ever), memory still works, and the device can be destroyed there.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>

#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/error.hpp"

namespace stowage {
namespace {

// Exit codes of the child, one per check, so a failure names the step.
enum Step : int {
  kPassed = 0,
  kStreamSynchronized = 10,
  kDeviceSynchronized,
  kCopyQueued,
  kEventWaited,
  kWrongError,
  kMemoryLost,
  kThrew,
};

// The refusal: a DeviceError that names fork() (anything else, or no error, is the step's code).
template <class F>
int refused(F&& f, int step) {
  try {
    f();
  } catch (const DeviceError& e) {
    return std::strstr(e.what(), "fork()") != nullptr ? kPassed : kWrongError;
  } catch (...) {
    return kWrongError;
  }
  return step;
}

int in_child(Device& dev, Stream s, Event e, unsigned char* block) {
  int code = kPassed;
  auto check = [&code](int result) {
    if (code == kPassed) code = result;
  };
  check(refused([&] { dev.synchronize(s); }, kStreamSynchronized));
  check(refused([&] { dev.synchronize(); }, kDeviceSynchronized));
  unsigned char byte = 0;
  check(refused([&] { dev.copy_async(&byte, block, 1, CopyKind::device_to_host, s); }, kCopyQueued));
  check(refused([&] { dev.synchronize(e); }, kEventWaited));
  // The child's copy of device memory is there, as everything else the parent had.
  void* more = dev.allocate(4096);
  if (block[0] != 0x5A || more == nullptr) check(kMemoryLost);
  dev.deallocate(more);
  return code;
}

TEST(EmulatedFork, AForkedChildIsRefusedStreamWorkAndTheParentGoesOn) {
  auto dev = make_emulated_device(0, EmulatedOptions{.capacity = 64 << 20});
  const Stream s = dev->create_stream(0);
  const Event e = dev->create_event(false);
  auto* block = static_cast<unsigned char*>(dev->allocate(4096));
  std::memset(block, 0x5A, 4096);
  // Work in flight at the fork: the event's record is queued behind it, and in the child nothing
  // will ever run it.
  dev->launch_host(s, [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); });
  dev->record(e, s);

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = kThrew;
    try {
      code = in_child(*dev, s, e, block);
      dev.reset();  // the destructor lets go of the parent's threads instead of joining them
    } catch (...) {
      code = kThrew;
    }
    ::_exit(code);
  }
  int status = 0;
  pid_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the forked child hung on stream work";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), kPassed);
  // The parent's streams are untouched: its work runs and its event completes.
  dev->synchronize(s);
  EXPECT_TRUE(dev->query(e));
  dev->destroy_event(e);
  dev->deallocate(block);
  dev->destroy_stream(s);
}

TEST(EmulatedFork, ADeviceMadeInTheChildWorksThere) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer cannot start threads after a multi-threaded fork() (it exits the child with 66)";
#endif
  auto parent = make_emulated_device(0, EmulatedOptions{.capacity = 64 << 20});
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = kThrew;
    try {
      auto dev = make_emulated_device(1, EmulatedOptions{.capacity = 64 << 20});
      const Stream s = dev->create_stream(0);
      auto* block = static_cast<unsigned char*>(dev->allocate(4096));
      unsigned char host = 0x11;
      dev->copy_async(block, &host, 1, CopyKind::host_to_device, s);
      dev->synchronize(s);
      code = block[0] == 0x11 ? kPassed : kMemoryLost;
      dev->deallocate(block);
      dev->destroy_stream(s);
    } catch (...) {
      code = kThrew;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), kPassed);
}

}  // namespace
}  // namespace stowage
