#pragma once
// Running a check in a forked child: its exit status comes back, and a child that hangs (on a
// lock a parent's thread held at the fork) is killed and fails the test instead of hanging it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "stowage/error.hpp"

namespace stowage::test {

// Waits (at most `limit`) until every other thread of this process has slept for three looks in a
// row. A thread running at the fork may hold a lock that then stays held in the child: ASan's
// runtime (GCC 12's) takes none of its allocator's locks around fork(), so a parent's thread that
// was starting or freeing at that moment hangs the child's first allocation of that size class.
// For a test whose child starts threads or allocates freely; tests that fork beside a busy
// thread on purpose do not call it.
inline void wait_for_other_threads_to_sleep(std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  const std::string self = std::to_string(::gettid());
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (int quiet = 0; quiet < 3 && std::chrono::steady_clock::now() < deadline;) {
    bool asleep = true;
    std::error_code error;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", error)) {
      if (task.path().filename() == self) continue;
      std::ifstream stat(task.path() / "stat");
      std::string line;
      std::getline(stat, line);
      const auto name_end = line.rfind(')');  // the state follows the name, which may hold spaces
      if (name_end != std::string::npos && name_end + 2 < line.size() && line[name_end + 2] == 'R') {
        asleep = false;
        break;
      }
    }
    if (error) return;  // no /proc: fork as before
    quiet = asleep ? quiet + 1 : 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// f's result as the child's exit status (98 when it threw), 128 + the signal that ended it, or
// -1 (and a test failure) when fork() failed or the child did not end within `limit`.
inline int in_child(const std::function<int()>& f, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  const pid_t pid = ::fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return -1;
  }
  if (pid == 0) {
    int code = 99;
    try {
      code = f();
    } catch (...) {
      code = 98;
    }
    ::_exit(code);
  }
  int status = 0;
  pid_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (((done = ::waitpid(pid, &status, WNOHANG)) == 0 || (done < 0 && errno == EINTR)) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (done <= 0) {  // still running at the deadline (or waitpid failed): never leave it behind
    const int error = done < 0 ? errno : 0;
    ::kill(pid, SIGKILL);
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (error != 0 && error != EINTR) ADD_FAILURE() << "waitpid: " << std::strerror(error);
    else ADD_FAILURE() << "the forked child hung";
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// For a child's exit status: 0 when every operation threw a DeviceError naming fork(), else
// 10 + the index of the first that did not throw, or 100 + the index of the first that threw
// something else (at most 80 operations: the codes stay apart from 98, 99 and below 256).
inline int refusals(const std::vector<std::function<void()>>& operations) {
  if (operations.size() > 80) {
    ADD_FAILURE() << "refusals: at most 80 operations";
    return -1;
  }
  for (std::size_t i = 0; i < operations.size(); ++i) {
    try {
      operations[i]();
      return 10 + static_cast<int>(i);
    } catch (const DeviceError& e) {
      if (std::strstr(e.what(), "fork()") == nullptr) return 100 + static_cast<int>(i);
    } catch (...) {
      return 100 + static_cast<int>(i);
    }
  }
  return 0;
}

}  // namespace stowage::test
