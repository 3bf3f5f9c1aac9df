// The C ABI called at thread exit. A client's thread-local destructor runs before stowage ends the
// thread's state (a pthread key's destructor, after every C++ thread_local): allocation, errors and
// tags all work there. A client's key destructor that runs after stowage's gets tags refused by
// name. A thread whose state is first made by a key destructor does not leak it (the ASan build's
// leak check sees it; it leaked 96 bytes when the state was a thread_local, whose destructor is
// never registered that late).
#include <gtest/gtest.h>
#include <pthread.h>

#include <string>
#include <thread>

#include "stowage/stowage.h"

namespace {

struct Seen {
  std::string error_before_exit;
  int push = -2, push_code = -1, pop = -2;
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
    seen.pop = stowage_pop_tag();
    void* p = stowage_malloc(1000, 0, nullptr);
    seen.allocated = p != nullptr;
    stowage_free(p, 1000, 0, nullptr);
    seen.free_code = stowage_last_error_code();
    (void)stowage_malloc(-7, 0, nullptr);
    seen.late_error = stowage_last_error();
  }
};
thread_local LateCaller late_caller;

TEST(CApiThreadExit, ACallFromALaterThreadLocalDestructorWorksTagsIncluded) {
  seen = Seen{};
  std::thread([] {
    late_caller.armed = true;
    ASSERT_EQ(stowage_push_tag("outer"), 0);  // stowage's thread state is made now, after the client's
    ASSERT_EQ(stowage_pop_tag(), 0);
    ASSERT_EQ(stowage_malloc(-3, 0, nullptr), nullptr);
  }).join();
  EXPECT_NE(seen.error_before_exit.find("negative size -3"), std::string::npos) << seen.error_before_exit;
  EXPECT_EQ(seen.push, 0);
  EXPECT_EQ(seen.push_code, STOWAGE_OK);
  EXPECT_EQ(seen.pop, 0);
  EXPECT_TRUE(seen.allocated);
  EXPECT_EQ(seen.free_code, STOWAGE_OK);
  EXPECT_NE(seen.late_error.find("negative size -7"), std::string::npos) << seen.late_error;
}

// A client's pthread key destructor on a thread whose only calls succeeded: stowage has no state
// for it yet, and the tag call makes it there.
void key_destructor_calls_in(void*) {
  seen.push = stowage_push_tag("late");
  seen.push_code = stowage_last_error_code();
  seen.push_error = stowage_last_error();
  seen.pop = stowage_pop_tag();
  (void)stowage_malloc(-9, 0, nullptr);
  seen.late_error = stowage_last_error();
}

TEST(CApiThreadExit, AClientsKeyDestructorMakesStateThatIsStillEnded) {
  seen = Seen{};
  pthread_key_t key{};
  ASSERT_EQ(pthread_key_create(&key, key_destructor_calls_in), 0);
  std::thread([key] {
    void* p = stowage_malloc(10, 0, nullptr);
    ASSERT_NE(p, nullptr);
    stowage_free(p, 10, 0, nullptr);
    ASSERT_EQ(pthread_setspecific(key, &seen), 0);
  }).join();
  EXPECT_EQ(seen.push, 0);
  EXPECT_EQ(seen.push_code, STOWAGE_OK);
  EXPECT_EQ(seen.pop, 0);
  EXPECT_NE(seen.late_error.find("negative size -9"), std::string::npos) << seen.late_error;
  ASSERT_EQ(pthread_key_delete(key), 0);
}

// A key destructor that runs again in the next round (it sets its key once more): its first round
// makes stowage's state for the thread, stowage's destructor (its key made first, so earlier in
// each round) ends it in the next, and that round's tag call is refused by name while its error
// message is still kept, cut short.
pthread_key_t rearming_key{};
int rounds = 0;
int pushes[2] = {-2, -2};
std::string refusal;

void rearming_destructor(void*) {
  const int round = rounds++;
  pushes[round] = stowage_push_tag("round");
  if (round == 0) {
    (void)stowage_pop_tag();
    (void)pthread_setspecific(rearming_key, &rounds);
  } else {
    refusal = stowage_last_error();
  }
}

TEST(CApiThreadExit, ATagCallAfterStowageEndedTheStateIsRefusedByName) {
  (void)stowage_push_tag("makes stowage's key");  // on this thread: the key exists before the client's
  (void)stowage_pop_tag();
  ASSERT_EQ(pthread_key_create(&rearming_key, rearming_destructor), 0);
  std::thread([] { ASSERT_EQ(pthread_setspecific(rearming_key, &rounds), 0); }).join();
  EXPECT_EQ(rounds, 2);
  EXPECT_EQ(pushes[0], 0);
  EXPECT_EQ(pushes[1], -1);
  EXPECT_NE(refusal.find("stowage_push_tag: this thread's tags are gone"), std::string::npos) << refusal;
  ASSERT_EQ(pthread_key_delete(rearming_key), 0);
}

}  // namespace
