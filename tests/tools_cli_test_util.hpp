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

// Runs `stowage <args>` and returns its exit code and its stdout and stderr together.
inline CommandResult run_cli(const std::string& args) {
  const std::string cmd = std::string(STOWAGE_CLI) + " " + args + " 2>&1";
  CommandResult r{-1, {}};
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe)) r.output += buf.data();
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace stowage::testing
