#pragma once
// The `stowage` command run as a user runs it, for the tools tests that check its exit codes and
// messages.
#include <array>
#include <cstdio>
#include <string>

#include <sys/wait.h>

namespace stowage::testing {

struct CommandResult {
  int exit_code;
  std::string output;
};

// Runs a shell command line; its exit code and its output.
inline CommandResult run_shell(const std::string& cmd) {
  CommandResult r{-1, {}};
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  while (const std::size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Runs `stowage <args>` with the environment variables `env` ("NAME=value ...") added and
// returns its exit code and its stdout and stderr together (redirections in `args` come after:
// "... 2>&1 >/dev/null" keeps stderr alone).
inline CommandResult run_cli(const std::string& args, const std::string& env = "") {
  return run_shell("env " + env + " '" + std::string(STOWAGE_CLI) + "' 2>&1 " + args);
}

}  // namespace stowage::testing
