#pragma once
// An emulated stream: a worker thread that runs its queue of tasks in order.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace stowage::emulated {

class StreamWorker {
 public:
  explicit StreamWorker(int priority);
  ~StreamWorker();  // runs what is queued, then joins
  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  void submit(std::function<void()> task);
  // Blocks until every task submitted before the call has run; rethrows the first exception a
  // task threw since the last synchronize.
  void synchronize();
  int priority() const { return priority_; }

 private:
  void run();

  int priority_;
  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  std::uint64_t submitted_ = 0, completed_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace stowage::emulated
