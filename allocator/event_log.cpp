// EventLog: the CSV, written with one append per line to a file of this process's own.
#include "stowage/event_log.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace stowage {

const char* to_string(EventAction action) { return action == EventAction::allocate ? "allocate" : "free"; }

std::string expand_event_log_path(const std::string& pattern) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    switch (pattern[++i]) {
      case 'p': out += std::to_string(::getpid()); break;
      case 'r': {
        const char* rank = std::getenv("RANK");
        if (rank == nullptr || *rank == '\0') rank = std::getenv("LOCAL_RANK");
        out += rank != nullptr && *rank != '\0' ? rank : "0";
        break;
      }
      case '%': out += '%'; break;
      default:
        throw InvalidArgument(
            fmt::format("event log: '{}': %{} is not a placeholder (%p the process id, %r the "
                        "rank, %% a percent sign)",
                        pattern, pattern[i]));
    }
  }
  return out;
}

namespace {

// Opens `path` for appending and takes its lock; -1 when another process holds the lock.
int open_locked(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0)
    throw InvalidArgument(fmt::format("event log: cannot open '{}' for writing: {}", path, std::strerror(errno)));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void write_all(int fd, const std::string& line) {
  // One write() per line: with O_APPEND the kernel puts it at the end whole.
  const ssize_t n = ::write(fd, line.data(), line.size());
  (void)n;  // a full disk loses lines, never the allocator's state
}

}  // namespace

struct EventLog::Impl {
  std::string path;
  int fd = -1;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

EventLog::EventLog(const std::string& pattern) : impl_(std::make_unique<Impl>()) {
  std::string path = expand_event_log_path(pattern);
  int fd = open_locked(path);
  if (fd < 0) {
    const std::string own = fmt::format("{}.{}", path, ::getpid());
    std::fprintf(stderr, "stowage: event log '%s' is being written by another process; this one writes '%s'\n",
                 path.c_str(), own.c_str());
    path = own;
    fd = open_locked(path);
    if (fd < 0) throw InvalidArgument(fmt::format("event log: '{}' is locked by another process", path));
  }
  // Ours now: start it afresh.
  if (::ftruncate(fd, 0) != 0) {
    ::close(fd);
    throw InvalidArgument(fmt::format("event log: cannot truncate '{}': {}", path, std::strerror(errno)));
  }
  write_all(fd, std::string(kEventLogHeader) + "\n");
  impl_->path = std::move(path);
  impl_->fd = fd;
}

EventLog::~EventLog() {
  if (impl_->fd >= 0) ::close(impl_->fd);  // closing releases the lock
}

const std::string& EventLog::path() const { return impl_->path; }

void EventLog::record(EventAction action, const void* pointer, std::size_t size, Stream stream) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - impl_->start).count();
  const auto thread = static_cast<long>(::syscall(SYS_gettid));
  write_all(impl_->fd,
            fmt::format("{},{:.9f},{},{:#x},{},{}\n", thread, seconds, to_string(action),
                        reinterpret_cast<std::uintptr_t>(pointer), size, static_cast<std::uint64_t>(stream)));
}

}  // namespace stowage
