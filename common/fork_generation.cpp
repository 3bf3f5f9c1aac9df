#include "common/fork_generation.hpp"

#include <pthread.h>

#include <fmt/format.h>

#include "stowage/error.hpp"

namespace stowage {

namespace detail {
constinit std::atomic<unsigned> forks_seen{0};
}  // namespace detail

namespace {
void count_fork() { detail::forks_seen.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

unsigned fork_generation() {
  // Registered at the first call, before an object that notes its generation exists: only forks
  // after that can part one from its threads.
  static const bool registered = ::pthread_atfork(nullptr, nullptr, &count_fork) == 0;
  (void)registered;
  return detail::forks_seen.load(std::memory_order_relaxed);
}

void refuse_in_forked_child(std::string_view what) {
  throw DeviceError(fmt::format(
      "{}: used in a process forked from the one that made it (fork() copies only the calling thread: locks the "
      "parent's other threads held stay held, and the device memory is the parent's). Use stowage in a child "
      "process only after exec(), e.g. with Python multiprocessing's 'spawn' or 'forkserver' start method, as "
      "CUDA requires too",
      what));
}

}  // namespace stowage
