#pragma once
// An emulated stream: a worker thread that runs its queue of tasks in order, on a logical clock.
//
// The clock is the emulated device's time. A task is ready when it was queued or when the task
// before it ended, whichever is later; it ends at `ready + its run time` unless it says otherwise
// (a record is instantaneous, a wait ends when the event's work did, a throttled copy when the
// link has carried its bytes). The worker's own wake-ups and hand-offs are therefore not device
// time, as a GPU's stream does not lose time between queued operations, but at most `slack` of
// them is forgiven: a logical end is never earlier than the real end minus the slack, so the
// clock cannot drift away from the wall clock. It never runs ahead of it.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace stowage::emulated {

using Clock = std::chrono::steady_clock;

class StreamWorker {
 public:
  StreamWorker(int priority, Clock::duration slack);
  ~StreamWorker();  // runs what is queued, then joins
  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  void submit(std::function<void()> task);
  // Blocks until every task submitted before the call has run; rethrows the first exception a
  // task threw since the last synchronize.
  void synchronize();
  // Blocks until every task submitted before the call has run; an exception is kept for
  // synchronize().
  void drain();
  int priority() const { return priority_; }

  // Inside a task: when it became ready on the logical clock (the wall clock elsewhere).
  static Clock::time_point ready();
  // Inside a task: its logical end (not after the wall clock's now).
  static void finish_at(Clock::time_point end);

 private:
  struct Task {
    std::function<void()> fn;
    Clock::time_point queued;
  };
  void run();

  int priority_;
  Clock::duration slack_;
  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Task> queue_;
  std::uint64_t submitted_ = 0, completed_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
  Clock::time_point last_end_{};  // the worker thread's alone
  std::thread thread_;
};

}  // namespace stowage::emulated
