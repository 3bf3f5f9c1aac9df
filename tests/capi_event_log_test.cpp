// The allocation event log: exact CSV lines from the LoggingResource and from the C ABI
// (STOWAGE_EVENT_LOG), a well-formed log under threads, and the reader's errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "stowage/caching_allocator.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/event_log.hpp"
#include "stowage/logging_resource.hpp"
#include "stowage/stowage.h"

namespace stowage {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(getpid()) + ".csv")).string();
}

// The C ABI reads STOWAGE_EVENT_LOG on first use; set it before any test runs.
const std::string capi_log = [] {
  std::string path = temp_path("stowage_capi_events");
  setenv("STOWAGE_EVENT_LOG", path.c_str(), 1);
  return path;
}();

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

class EventLogTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> device = make_emulated_device(0, EmulatedOptions{.capacity = 64 << 20});
  CachingAllocator allocator{*device};
  std::string path = temp_path("stowage_event_log");
  void TearDown() override { std::filesystem::remove(path); }
};

TEST_F(EventLogTest, OneLinePerAllocationAndFreeInRmmColumns) {
  const Stream side = device->create_stream();
  {
    LoggingResource logging(allocator, std::make_shared<EventLog>(path));
    void* a = logging.allocate(1000);
    void* b = logging.allocate(70000, side);
    EXPECT_EQ(logging.allocate(0), nullptr);         // nothing to log
    logging.deallocate(a, allocator.block_size(a));  // the rounded size is accepted; 1000 is logged
    logging.deallocate(b, 70000);
    EXPECT_THROW(logging.deallocate(b), InvalidArgument);  // double free: not logged
    const auto records = read_event_log(path);
    ASSERT_EQ(records.size(), 4u);
    const auto tid = static_cast<std::uint64_t>(syscall(SYS_gettid));
    const EventAction actions[] = {EventAction::allocate, EventAction::allocate, EventAction::free, EventAction::free};
    void* pointers[] = {a, b, a, b};
    const std::size_t sizes[] = {1000, 70000, 1000, 70000};
    const Stream streams[] = {kDefaultStream, side, kDefaultStream, side};
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(records[i].thread, tid);
      EXPECT_EQ(records[i].action, actions[i]);
      EXPECT_EQ(records[i].pointer, reinterpret_cast<std::uintptr_t>(pointers[i]));
      EXPECT_EQ(records[i].size, sizes[i]);
      EXPECT_EQ(records[i].stream, static_cast<std::uint64_t>(streams[i]));
      if (i > 0) EXPECT_GE(records[i].time, records[i - 1].time);
    }
    const auto lines = lines_of(path);
    ASSERT_EQ(lines.size(), 5u);
    EXPECT_EQ(lines[0], "Thread,Time,Action,Pointer,Size,Stream");
    EXPECT_TRUE(std::regex_match(lines[1], std::regex("[0-9]+,[0-9]+\\.[0-9]{9},allocate,0x[0-9a-f]+,1000,0")))
        << lines[1];
    EXPECT_TRUE(std::regex_match(lines[4], std::regex("[0-9]+,[0-9.]+,free,0x[0-9a-f]+,70000,[1-9][0-9]*")))
        << lines[4];
  }
  device->synchronize();
  allocator.empty_cache();
  device->destroy_stream(side);
}

TEST_F(EventLogTest, ConcurrentThreadsWriteAWellFormedLog) {
  {
    LoggingResource logging(allocator, std::make_shared<EventLog>(path));
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (int i = 0; i < 200; ++i) logging.deallocate(logging.allocate(512 * (1 + (i + t) % 7)));
      });
    for (auto& th : threads) th.join();
  }
  const auto records = read_event_log(path);
  ASSERT_EQ(records.size(), 4u * 200 * 2);
  // Replaying in file order never frees an address that is not live nor reuses a live one.
  std::map<std::uintptr_t, std::size_t> live;
  std::map<std::uint64_t, int> per_thread;
  for (const auto& r : records) {
    ++per_thread[r.thread];
    if (r.action == EventAction::allocate) {
      EXPECT_TRUE(live.emplace(r.pointer, r.size).second) << "address reused while live";
    } else {
      auto it = live.find(r.pointer);
      ASSERT_NE(it, live.end()) << "free of an address that is not live";
      EXPECT_EQ(it->second, r.size);
      live.erase(it);
    }
  }
  EXPECT_TRUE(live.empty());
  EXPECT_EQ(per_thread.size(), 4u);
  for (auto& [tid, n] : per_thread) EXPECT_EQ(n, 400);
}

TEST_F(EventLogTest, UnwritablePathIsInvalidArgument) {
  EXPECT_THROW(EventLog("/nonexistent-dir/events.csv"), InvalidArgument);
}

// What torchrun does with an exported STOWAGE_EVENT_LOG: several processes open the same name.
// Neither truncates the other; each writes a complete log of its own that parses.
TEST_F(EventLogTest, TwoProcessesSharingANameWriteTwoCompleteLogs) {
  constexpr int kLines = 3000;
  auto write = [](EventLog& log) {
    for (int i = 0; i < kLines; ++i)
      log.record(i % 2 ? EventAction::free : EventAction::allocate, reinterpret_cast<void*>(0x1000 * (i / 2 + 1)), 4096,
                 kDefaultStream);
  };
  EventLog mine(path);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int status = 1;
    try {
      EventLog theirs(path);  // the name is taken: <path>.<pid>
      write(theirs);
      status = theirs.path() == path + "." + std::to_string(::getpid()) ? 0 : 2;
    } catch (...) {
      status = 3;
    }
    ::_exit(status);
  }
  write(mine);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const std::string theirs = path + "." + std::to_string(child);
  for (const std::string& file : {path, theirs}) {
    const auto records = read_event_log(file);
    EXPECT_EQ(records.size(), static_cast<std::size_t>(kLines)) << file;
    EXPECT_EQ(lines_of(file).size(), static_cast<std::size_t>(kLines) + 1) << file;
  }
  std::filesystem::remove(theirs);
}

TEST_F(EventLogTest, PlaceholdersNameAFilePerProcessAndRank) {
  ::setenv("RANK", "3", 1);
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const std::string expanded = expand_event_log_path(dir + "/ev_%p_r%r_100%%.csv");
  EXPECT_EQ(expanded, dir + "/ev_" + std::to_string(::getpid()) + "_r3_100%.csv");
  {
    EventLog log(dir + "/ev_%p_r%r_100%%.csv");
    EXPECT_EQ(log.path(), expanded);
  }
  ::unsetenv("RANK");
  EXPECT_EQ(expand_event_log_path("a_%r"), "a_0");
  EXPECT_THROW(expand_event_log_path("a_%q.csv"), InvalidArgument);
  std::filesystem::remove(expanded);
}

std::string parse_error(const std::string& text) {
  std::istringstream in(text);
  try {
    parse_event_log(in, "test.csv");
  } catch (const ParseError& e) {
    return e.what();
  }
  return "no error";
}

TEST(EventLogReader, ParsesHexAndDecimalAndSkipsBlankLines) {
  std::istringstream in(
      "Thread,Time,Action,Pointer,Size,Stream\r\n\n12,0.5,allocate,0x7f00,4096,0\n"
      "12,0.75,free,32512,4096,0x10\n");
  const auto r = parse_event_log(in);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].pointer, 0x7f00u);
  EXPECT_EQ(r[1].pointer, 0x7f00u);
  EXPECT_EQ(r[1].stream, 16u);
  EXPECT_EQ(r[1].time, 0.75);
  EXPECT_EQ(r[1].action, EventAction::free);
}

TEST(EventLogReader, MalformedLinesNameTheirLineNumber) {
  const std::string h = "Thread,Time,Action,Pointer,Size,Stream\n";
  EXPECT_NE(parse_error("").find("empty"), std::string::npos);
  EXPECT_NE(parse_error("Thread,Time\n").find("test.csv line 1: expected the header"), std::string::npos);
  EXPECT_NE(parse_error(h + "1,0.1,allocate,0x10,16,0\n1,0.2,release,0x10,16,0\n").find("line 3: bad action"),
            std::string::npos);
  EXPECT_NE(parse_error(h + "1,0.1,allocate,0x10,16\n").find("line 2: expected 6 fields"), std::string::npos);
  EXPECT_NE(parse_error(h + "1,0.1,allocate,0x10,16,0,9\n").find("line 2: expected 6 fields"), std::string::npos);
  EXPECT_NE(parse_error(h + "1,0.1,allocate,0xZZ,16,0\n").find("line 2: bad pointer"), std::string::npos);
  EXPECT_NE(parse_error(h + "1,-3,allocate,0x10,16,0\n").find("line 2: bad time"), std::string::npos);
  EXPECT_NE(parse_error(h + "1,0.1,allocate,0x10,-16,0\n").find("line 2: bad size"), std::string::npos);
  EXPECT_NE(parse_error(h + "t1,0.1,allocate,0x10,16,0\n").find("line 2: bad thread"), std::string::npos);
  EXPECT_THROW(read_event_log("/nonexistent-dir/events.csv"), ParseError);
}

TEST(EventLogCApi, StowageEventLogRecordsTheDropInLibrary) {
  void* p = stowage_malloc(5000, 0, nullptr);
  ASSERT_NE(p, nullptr) << stowage_last_error();
  int foreign = 0;
  stowage_free(&foreign, 4, 0, nullptr);  // rejected: not logged
  stowage_free(p, 5000, 0, nullptr);
  const auto records = read_event_log(capi_log);
  std::filesystem::remove(capi_log);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].action, EventAction::allocate);
  EXPECT_EQ(records[0].pointer, reinterpret_cast<std::uintptr_t>(p));
  EXPECT_EQ(records[0].size, 5000u);
  EXPECT_EQ(records[1].action, EventAction::free);
  EXPECT_EQ(records[1].pointer, reinterpret_cast<std::uintptr_t>(p));
  EXPECT_EQ(records[1].size, 5000u);
}

}  // namespace
}  // namespace stowage
