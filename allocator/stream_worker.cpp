#include "allocator/stream_worker.hpp"

namespace stowage::emulated {

StreamWorker::StreamWorker(int priority) : priority_(priority), thread_([this] { run(); }) {}

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
    queue_.push_back(std::move(task));
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

void StreamWorker::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    auto task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::exception_ptr failure;
    try {
      task();
    } catch (...) {
      failure = std::current_exception();
    }
    task = nullptr;  // release captures before reporting completion
    lock.lock();
    if (failure && !error_) error_ = failure;
    ++completed_;
    done_cv_.notify_all();
  }
}

}  // namespace stowage::emulated
