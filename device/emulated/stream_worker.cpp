#include "device/emulated/stream_worker.hpp"

#include <algorithm>
#include <optional>

namespace stowage::emulated {
namespace {

// The task a worker thread is running: its ready time and, if it set one, its logical end.
struct Current {
  bool active = false;
  Clock::time_point ready{};
  std::optional<Clock::time_point> end;
};
thread_local Current current;  // NOLINT(cert-err58-cpp): value-initialised, cannot throw

}  // namespace

StreamWorker::StreamWorker(int priority, Clock::duration slack)
    : priority_(priority), slack_(slack), thread_([this] { run(); }) {}

StreamWorker::~StreamWorker() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void StreamWorker::submit(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(Task{std::move(task), Clock::now()});
    ++submitted_;
  }
  work_cv_.notify_one();
}

void StreamWorker::synchronize() {
  std::unique_lock lock(mutex_);
  const std::uint64_t target = submitted_;
  done_cv_.wait(lock, [&] { return completed_ >= target; });
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void StreamWorker::drain() {
  std::unique_lock lock(mutex_);
  const std::uint64_t target = submitted_;
  done_cv_.wait(lock, [&] { return completed_ >= target; });
}

Clock::time_point StreamWorker::ready() { return current.active ? current.ready : Clock::now(); }

void StreamWorker::finish_at(Clock::time_point end) {
  if (current.active) current.end = end;
}

void StreamWorker::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    auto task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    const auto started = Clock::now();
    current = Current{true, std::max(task.queued, last_end_), std::nullopt};
    std::exception_ptr failure;
    try {
      task.fn();
    } catch (...) {
      failure = std::current_exception();
    }
    task.fn = nullptr;  // release captures before reporting completion
    const auto now = Clock::now();
    const auto end = current.end.value_or(current.ready + (now - started));
    last_end_ = std::clamp(end, now - slack_, now);
    current = Current{};
    lock.lock();
    if (failure && !error_) error_ = failure;
    ++completed_;
    done_cv_.notify_all();
  }
}

}  // namespace stowage::emulated
