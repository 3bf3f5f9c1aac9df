// The expandable segments' address reservations under a limit on the process's address space
// (ulimit -v): a refused reservation is retried smaller, and when even what a request needs is
// refused, the error says it is address space and names the limit. Each case runs in a child
// process, whose limit it lowers.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <string>

#include "allocator_test_util.hpp"

namespace stowage {
namespace {

using namespace test;

constexpr std::size_t GiB = std::size_t{1} << 30;

// The process's mapped address space now (VmSize), in bytes.
std::size_t address_space_in_use() {
  std::ifstream status("/proc/self/status");
  std::string key;
  std::size_t kib = 0;
  while (status >> key) {
    if (key == "VmSize:") {
      status >> kib;
      break;
    }
  }
  return kib * 1024;
}

// Runs f in a child whose address space may grow by `headroom` bytes; its exit status.
int in_child_with_headroom(std::size_t headroom, const std::function<int()>& f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const rlimit limit{address_space_in_use() + headroom, address_space_in_use() + headroom};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(90);
    int status = 91;
    try {
      status = f();
    } catch (...) {
      status = 92;
    }
    ::_exit(status);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

bool sanitized() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

// An 8 GiB device asks for 16 GiB of address space per pool by default; with 12 GiB to spare the
// reservations shrink to fit, and allocating works.
TEST(AddressSpace, ReservationsShrinkToALimitedAddressSpace) {
  if (sanitized()) GTEST_SKIP() << "sanitizers map terabytes of shadow memory: no room for a limit";
  const int status = in_child_with_headroom(12 * GiB, [] {
    EmulatedOptions o;
    o.capacity = 8 * GiB;
    auto dev = make_emulated_device(0, o);
    CachingAllocator a(*dev);
    void* small = a.allocate(MiB);
    void* large = a.allocate(256 * MiB);
    const bool ok = small != nullptr && large != nullptr && a.segment_mode() == SegmentMode::expandable;
    a.deallocate(small);
    a.deallocate(large);
    return ok ? 0 : 1;
  });
  EXPECT_EQ(status, 0);
}

TEST(AddressSpace, ARefusalTooSmallForTheRequestSaysItIsAddressSpace) {
  if (sanitized()) GTEST_SKIP() << "sanitizers map terabytes of shadow memory: no room for a limit";
  const int status = in_child_with_headroom(256 * MiB, [] {
    EmulatedOptions o;
    o.capacity = 8 * GiB;
    auto dev = make_emulated_device(0, o);
    CachingAllocator a(*dev);
    try {
      a.allocate(2 * GiB);
      return 1;
    } catch (const OutOfMemory& e) {
      const std::string what = e.what();
      return what.find("address space") != std::string::npos && what.find("ulimit -v") != std::string::npos ? 0 : 2;
    }
  });
  EXPECT_EQ(status, 0);
}

// A device near the largest capacity the emulated backend takes (2^47 bytes) reserves what its
// address space allows and allocates: a 100 TiB device used to accept its capacity and then
// refuse every allocation.
TEST(AddressSpace, AHundredTebibyteDeviceAllocates) {
  if (sanitized()) GTEST_SKIP() << "sanitizers map terabytes of shadow memory";
  for (std::size_t tib : {100, 127}) {
    EmulatedOptions o;
    o.capacity = tib << 40;
    auto dev = make_emulated_device(0, o);
    CachingAllocator a(*dev);
    void* blocks[3] = {a.allocate(GiB), a.allocate(GiB), a.allocate(MiB)};
    for (void* b : blocks) ASSERT_NE(b, nullptr) << tib << " TiB";
    EXPECT_EQ(a.stats().allocated_bytes.all.current, std::int64_t(2 * GiB + MiB)) << tib << " TiB";
    for (void* b : blocks) a.deallocate(b);
  }
}

}  // namespace
}  // namespace stowage
