#pragma once
// A small lock for critical sections of a few dozen instructions that are rarely contended (a
// thread's own cache, one shard of the live-block map): an exchange to take it, a store to give
// it back. A waiter spins briefly, then yields, so a descheduled holder is not starved.
#include <atomic>
#include <thread>

namespace stowage::detail {

class SpinLock {
 public:
  void lock() noexcept {
    for (int spins = 0; locked_.exchange(true, std::memory_order_acquire); ++spins) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins > 64) std::this_thread::yield();
      }
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace stowage::detail
