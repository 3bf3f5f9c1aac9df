// The C ABI called from a client's thread-local destructor that runs after stowage's own
// thread-locals are gone (they die in reverse order of construction): allocation and errors keep
// working, the last error survives, and tags are refused by name instead of touching freed memory.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "stowage/stowage.h"

namespace {

struct Seen {
  std::string error_before_exit;
  int push = 0, push_code = 0;
  std::string push_error;
  bool allocated = false;
  int free_code = -1;
  std::string late_error;
};
Seen seen;

// Constructed in the thread before any stowage call, so destroyed after stowage's thread-locals.
struct LateCaller {
  bool armed = false;
  ~LateCaller() {
    if (!armed) return;
    seen.error_before_exit = stowage_last_error();
    seen.push = stowage_push_tag("teardown");
    seen.push_code = stowage_last_error_code();
    seen.push_error = stowage_last_error();
    void* p = stowage_malloc(1000, 0, nullptr);
    seen.allocated = p != nullptr;
    stowage_free(p, 1000, 0, nullptr);
    seen.free_code = stowage_last_error_code();
    (void)stowage_malloc(-7, 0, nullptr);
    seen.late_error = stowage_last_error();
  }
};
thread_local LateCaller late_caller;

TEST(CApiThreadExit, ACallFromALaterThreadLocalDestructorWorksAndTagsAreRefused) {
  std::thread([] {
    late_caller.armed = true;
    ASSERT_EQ(stowage_push_tag("outer"), 0);  // stowage's thread state is made now, after the client's
    ASSERT_EQ(stowage_pop_tag(), 0);
    ASSERT_EQ(stowage_malloc(-3, 0, nullptr), nullptr);
  }).join();
  EXPECT_NE(seen.error_before_exit.find("negative size -3"), std::string::npos) << seen.error_before_exit;
  EXPECT_EQ(seen.push, -1);
  EXPECT_EQ(seen.push_code, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(seen.push_error.find("stowage_push_tag: this thread's tags are gone"), std::string::npos)
      << seen.push_error;
  EXPECT_TRUE(seen.allocated);
  EXPECT_EQ(seen.free_code, STOWAGE_OK);
  EXPECT_NE(seen.late_error.find("negative size -7"), std::string::npos) << seen.late_error;
}

}  // namespace
