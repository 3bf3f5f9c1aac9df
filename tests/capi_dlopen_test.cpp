// libstowage.so as frameworks load it: dlopen(RTLD_NOW | RTLD_LOCAL) in a bare process (a C
// helper, no preload, no STOWAGE_* variables) driven only through dlsym'd C symbols; and the
// library must not depend on Debian's libjemalloc, which cannot be dlopen'ed (static TLS).
#include <gtest/gtest.h>

#include <elf.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

// DT_NEEDED entries of an ELF64 shared object, read from its .dynamic section.
std::vector<std::string> needed_libraries(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> needed;
  if (bytes.size() < sizeof(Elf64_Ehdr) || std::memcmp(bytes.data(), ELFMAG, SELFMAG) != 0) return needed;
  Elf64_Ehdr eh;
  std::memcpy(&eh, bytes.data(), sizeof eh);
  auto section = [&](std::size_t i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, bytes.data() + eh.e_shoff + i * eh.e_shentsize, sizeof sh);
    return sh;
  };
  for (std::size_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr dyn = section(i);
    if (dyn.sh_type != SHT_DYNAMIC) continue;
    const Elf64_Shdr strtab = section(dyn.sh_link);
    for (std::size_t off = 0; off + sizeof(Elf64_Dyn) <= dyn.sh_size; off += sizeof(Elf64_Dyn)) {
      Elf64_Dyn d;
      std::memcpy(&d, bytes.data() + dyn.sh_offset + off, sizeof d);
      if (d.d_tag == DT_NULL) break;
      if (d.d_tag == DT_NEEDED) needed.emplace_back(bytes.data() + strtab.sh_offset + d.d_un.d_val);
    }
  }
  return needed;
}

struct HelperRun {
  int exit_code = -1;
  std::string output;
};

// Runs the helper with the environment minus LD_PRELOAD and every STOWAGE_* variable, plus
// `extra` ("NAME=value") when given.
HelperRun run_helper(const std::string& extra = "") {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string v = *e;
    if (v.rfind("LD_PRELOAD=", 0) == 0 || v.rfind("STOWAGE_", 0) == 0) continue;
    env_strings.push_back(v);
  }
  if (!extra.empty()) env_strings.push_back(extra);
  std::vector<char*> envp;
  for (auto& v : env_strings) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::string helper = STOWAGE_DLOPEN_HELPER, library = STOWAGE_SHARED_LIBRARY;
  char* argv[] = {helper.data(), library.data(), nullptr};

  int pipe_fds[2];
  HelperRun run;
  if (pipe(pipe_fds) != 0) return run;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, helper.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (rc == 0) {
    char buf[4096];
    for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) run.output.append(buf, static_cast<std::size_t>(n));
    int status = 0;
    waitpid(pid, &status, 0);
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  close(pipe_fds[0]);
  return run;
}

// The helper's lines, keyed by their first word (a line "bad X ..." is keyed "bad X").
std::map<std::string, std::string> facts(const std::string& output) {
  std::map<std::string, std::string> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string key, word;
    words >> key;
    if (key == "bad") {
      words >> word;
      key += " " + word;
    }
    std::getline(words, word);
    out[key] = word.empty() ? word : word.substr(1);
  }
  return out;
}

TEST(CApiDlopen, LibraryHasNoJemallocDependency) {
  const auto needed = needed_libraries(STOWAGE_SHARED_LIBRARY);
  ASSERT_FALSE(needed.empty()) << "no DT_NEEDED read from " << STOWAGE_SHARED_LIBRARY;
  bool libc = false;
  for (const auto& n : needed) {
    EXPECT_EQ(n.find("jemalloc"), std::string::npos) << STOWAGE_SHARED_LIBRARY << " needs " << n;
    libc |= n.rfind("libc.so", 0) == 0;
  }
  EXPECT_TRUE(libc);
}

TEST(CApiDlopen, BareProcessLoadsAndDrivesTheCSymbols) {
  const HelperRun run = run_helper();
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto f = facts(run.output);
  EXPECT_EQ(f["dlopen"], "ok") << run.output;
  EXPECT_EQ(f["symbols"], "ok");
  EXPECT_EQ(f["bytes"], "ok");
  EXPECT_EQ(f["live"], "allocations=1 requested=1048576");
  for (const char* bad : {"foreign_free", "wrong_size", "wrong_device", "negative_free", "negative_malloc",
                          "record_foreign", "double_free", "beyond_cap"}) {
    const std::string& line = f[std::string("bad ") + bad];
    EXPECT_EQ(line.rfind("rejected=1 unchanged=1 error=", 0), 0u) << bad << ": " << line;
    EXPECT_GT(line.size(), std::strlen("rejected=1 unchanged=1 error=")) << bad << " has no error message";
  }
  EXPECT_EQ(f["continue"], "ok live=0");
  EXPECT_EQ(f["empty_cache"], "reserved=0");
  EXPECT_EQ(f["mapped"], "stowage=1 jemalloc=0") << "libjemalloc came in with libstowage.so";
}

TEST(CApiDlopen, MalformedConfigurationFailsTheCallNotTheProcess) {
  const HelperRun run = run_helper("STOWAGE_EMULATED_CAPACITY=lots");
  EXPECT_EQ(run.exit_code, 4) << run.output;  // the helper's "malloc failed" exit
  EXPECT_NE(run.output.find("malloc FAIL STOWAGE_EMULATED_CAPACITY: 'lots' is not a byte size"), std::string::npos)
      << run.output;
}

// The process-wide devices live until the process ends and their stream workers run the
// library's code, so dlclose must not unmap it (linked with -z nodelete) — even when only joined
// threads used it and nothing else holds it mapped.
TEST(CApiDlopen, DlcloseKeepsTheLibraryMappedUnderItsWorkers) {
  const HelperRun run = run_helper("HELPER_DLCLOSE_AFTER_JOINED_THREAD=1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto f = facts(run.output);
  EXPECT_EQ(f["joined"], "ok") << run.output;
  EXPECT_EQ(f["after_dlclose"], "stowage=1") << run.output;
}

}  // namespace
