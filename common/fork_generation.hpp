#pragma once
// How many fork()s lie between the program's start and the calling process: 0 in the process that
// started, 1 in its child, 2 in a grandchild. fork() copies only the calling thread: in the child
// the parent's other threads are gone (a stream's worker, a thread that held a lock keeps it held
// for ever), and device memory and contexts are the parent's (a CUDA context does not survive
// fork() either). So an object that keeps threads, locks or device memory notes the generation it
// was made in and refuses to work in another (the emulated device, the caching allocator).
#include <atomic>
#include <string_view>

namespace stowage {

namespace detail {
// Raised in the child by the pthread_atfork handler that fork_generation() registers.
[[gnu::visibility("hidden")]] extern std::atomic<unsigned> forks_seen;
}  // namespace detail

// The calling process's generation. The first call registers the count: call it where an object
// is made, before any fork() that could part it from its threads.
unsigned fork_generation();

// Whether the calling process is not the one of `generation`: one relaxed load, for hot paths
// (the child's handler ran on the thread that reads it).
inline bool forked_since(unsigned generation) {
  return detail::forks_seen.load(std::memory_order_relaxed) != generation;
}

// Throws DeviceError: `what` was used in a process forked from the one that made it, and what to
// do instead.
[[noreturn, gnu::cold]] void refuse_in_forked_child(std::string_view what);

}  // namespace stowage
