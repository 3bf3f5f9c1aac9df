// STOWAGE_FAULTS: parsed into Config::faults, and the process-wide devices (so the C ABI too)
// are wrapped in the fault-injecting adaptor when it is set. The registry reads the environment
// once per process, so each case runs this executable again as a child with the variables set
// (child mode: STOWAGE_FAULTS_TEST_CHILD) and checks the facts it prints.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "stowage/config.hpp"
#include "stowage/fault_injection.hpp"
#include "stowage/runtime.hpp"
#include "stowage/stowage.h"

extern char** environ;

namespace stowage {
namespace {

using ::testing::HasSubstr;

std::string self_path;

// ---- child: drive the registry's device and the C ABI, print one fact per line -------------

int child_main() {
  try {
    Device& d = device(0);
    auto* faulty = dynamic_cast<FaultInjectingDevice*>(&d);
    std::printf("wrapped %d\n", faulty != nullptr);
    std::string outcomes;
    std::vector<void*> got;
    for (int i = 0; i < 6; ++i) {
      try {
        got.push_back(d.allocate(4096));
        outcomes += "ok ";
      } catch (const OutOfMemory&) {
        outcomes += "oom ";
      }
    }
    for (void* p : got) d.deallocate(p);
    std::printf("device_allocs %s\n", outcomes.c_str());
  } catch (const std::exception& e) {
    std::printf("device_error %s\n", e.what());
  }
  void* p = stowage_malloc(1 << 20, 0, nullptr);
  std::printf("capi_malloc %s\n", p ? "ok" : "null");
  if (!p) std::printf("capi_error %s\n", stowage_last_error());
  if (p) stowage_free(p, 1 << 20, 0, nullptr);
  if (stowage_empty_cache(0) == 0) {
    Device& d = device(0);
    std::printf("device_free %zu of %zu\n", d.free_memory(), d.capacity());
  }
  std::fflush(stdout);
  return 0;
}

// ---- parent -----------------------------------------------------------------------------

// Runs this executable in child mode with the environment minus STOWAGE_* plus `extra`.
std::map<std::string, std::string> run_child(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::string(*e).rfind("STOWAGE_", 0) != 0) env.emplace_back(*e);
  env.emplace_back("STOWAGE_FAULTS_TEST_CHILD=1");
  env.emplace_back("STOWAGE_DEVICE=emulated");
  env.emplace_back("STOWAGE_EMULATED_CAPACITY=64MiB");
  env.insert(env.end(), extra.begin(), extra.end());
  std::vector<char*> envp;
  for (auto& v : env) envp.push_back(v.data());
  envp.push_back(nullptr);
  char* argv[] = {self_path.data(), nullptr};

  std::map<std::string, std::string> facts;
  int fds[2];
  if (pipe(fds) != 0) return facts;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, self_path.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::string out;
  if (rc == 0) {
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    int status = 0;
    waitpid(pid, &status, 0);
    facts["exit"] = std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  close(fds[0]);
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    const auto space = line.find(' ');
    facts[line.substr(0, space)] = space == std::string::npos ? "" : line.substr(space + 1);
  }
  return facts;
}

Config load(const std::map<std::string, std::string>& env) {
  return load_config([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(FaultsConfig, ParsedIntoTheConfiguration) {
  EXPECT_FALSE(load({}).faults.any());
  const FaultPlan p = load({{"STOWAGE_FAULTS", "alloc=7,copy=11"}}).faults;
  EXPECT_EQ(p.allocation_every, 7u);
  EXPECT_EQ(p.map_every, 0u);
  EXPECT_EQ(p.pin_every, 0u);
  EXPECT_EQ(p.copy_every, 11u);
  EXPECT_FALSE(load({{"STOWAGE_FAULTS", ""}}).faults.any());
}

TEST(FaultsConfig, MalformedValueIsAParseErrorNamingTheVariable) {
  for (const char* bad : {"alloc", "alloc=x", "alloc=-1", "alloc=3,disk=2", "alloc=3;map=2"}) {
    try {
      load({{"STOWAGE_FAULTS", bad}});
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const ParseError& e) {
      EXPECT_THAT(e.what(), HasSubstr("STOWAGE_FAULTS")) << bad;
    }
  }
}

TEST(FaultsFromEnvironment, RegistryDeviceFailsEveryNthAllocation) {
  auto f = run_child({"STOWAGE_FAULTS=alloc=3"});
  ASSERT_EQ(f["exit"], "0");
  EXPECT_EQ(f["wrapped"], "1");
  EXPECT_EQ(f["device_allocs"], "ok ok oom ok ok oom ");
  EXPECT_EQ(f["device_free"], "67108864 of 67108864");  // nothing kept after the failures
}

TEST(FaultsFromEnvironment, CApiReportsTheRefusalAndKeepsWorking) {
  auto f = run_child({"STOWAGE_FAULTS=alloc=1"});
  ASSERT_EQ(f["exit"], "0");
  EXPECT_EQ(f["wrapped"], "1");
  EXPECT_EQ(f["device_allocs"], "oom oom oom oom oom oom ");
  EXPECT_EQ(f["capi_malloc"], "null");
  EXPECT_THAT(f["capi_error"], HasSubstr("stowage: out of memory on device 0"));
  EXPECT_THAT(f["capi_error"], HasSubstr("injected allocation fault"));
  EXPECT_EQ(f["device_free"], "67108864 of 67108864");
}

TEST(FaultsFromEnvironment, UnsetMeansAPlainDevice) {
  auto f = run_child({});
  ASSERT_EQ(f["exit"], "0");
  EXPECT_EQ(f["wrapped"], "0");
  EXPECT_EQ(f["device_allocs"], "ok ok ok ok ok ok ");
  EXPECT_EQ(f["capi_malloc"], "ok");
  EXPECT_EQ(f["device_free"], "67108864 of 67108864");
}

TEST(FaultsFromEnvironment, MalformedValueFailsTheCallsNotSilently) {
  auto f = run_child({"STOWAGE_FAULTS=alloc=often"});
  ASSERT_EQ(f["exit"], "0");
  EXPECT_EQ(f.count("wrapped"), 0u) << "a device was handed out despite the malformed variable";
  EXPECT_THAT(f["device_error"], HasSubstr("STOWAGE_FAULTS"));
  EXPECT_THAT(f["device_error"], HasSubstr("often"));
  EXPECT_EQ(f["capi_malloc"], "null");
  EXPECT_THAT(f["capi_error"], HasSubstr("STOWAGE_FAULTS"));
}

}  // namespace
}  // namespace stowage

int main(int argc, char** argv) {
  if (std::getenv("STOWAGE_FAULTS_TEST_CHILD") != nullptr) return stowage::child_main();
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n > 0) stowage::self_path.assign(path, static_cast<std::size_t>(n));
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
