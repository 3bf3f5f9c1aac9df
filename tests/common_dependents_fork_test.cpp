// A Dependency ended in a forked child: the list's mutex may be held for ever by a parent thread
// fork() did not copy, so the child takes no lock (it only counts). Not run under TSan: fork()
// beside a running thread is what it tests.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "fork_test_util.hpp"
#include "stowage/dependents.hpp"

namespace stowage {
namespace {

TEST(DependentsFork, AChildEndsADependencyWithoutTheParentsLock) {
  Dependents owner;
  std::atomic<bool> stop{false};
  // Registers and ends registrations all the time: at a fork it often holds the list's mutex.
  std::thread churn([&] {
    std::vector<Dependency> held(64);
    while (!stop.load(std::memory_order_relaxed))
      for (Dependency& d : held) d = owner.add("owner", "churn");  // the old one ends: two locks
  });
  int hung = 0, failed = 0;
  for (int i = 0; i < 2000 && hung == 0; ++i) {  // one hang says it all
    Dependency mine = owner.add("owner", "mine");
    const int status = test::in_child(
        [&] {
          const std::size_t before = owner.count();
          mine.reset();
          const bool counted = owner.count() == before - 1;
          owner.check_none_left();  // a parent's owner: no check in a child (and no lock)
          return counted ? 0 : 1;
        },
        std::chrono::seconds(2));
    if (status == -1) ++hung;
    else if (status != 0) ++failed;
  }
  stop = true;
  churn.join();
  EXPECT_EQ(hung, 0) << "children blocked on a lock a parent thread held at fork()";
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(owner.count(), 0u);
}

}  // namespace
}  // namespace stowage
