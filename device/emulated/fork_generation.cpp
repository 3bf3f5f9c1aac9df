#include "device/emulated/fork_generation.hpp"

#include <pthread.h>

#include <atomic>

namespace stowage::emulated {
namespace {

std::atomic<unsigned> forks{0};
void count_fork() { forks.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

unsigned fork_generation() {
  // Registered at the first call, before a device exists: only forks after that can part a device
  // from its threads.
  static const bool registered = ::pthread_atfork(nullptr, nullptr, &count_fork) == 0;
  (void)registered;
  return forks.load(std::memory_order_relaxed);
}

}  // namespace stowage::emulated
