#pragma once
// Each subcommand of `stowage` registers itself from its own file with STOWAGE_COMMAND, so
// adding a command touches no shared list.
#include <CLI/CLI.hpp>

#include <functional>
#include <vector>

namespace stowage::tools {

// Adds a subcommand to the app; the callback it sets returns the process exit code via `exit_code`.
using CommandSetup = std::function<void(CLI::App& app, int& exit_code)>;

struct CommandRegistry {
  static std::vector<std::pair<int, CommandSetup>>& all();
};

// Runs during static initialisation, where only running out of memory could throw, and that
// may as well end the program (noexcept) before main.
struct RegisterCommand {
  template <class Setup>
  RegisterCommand(int order, Setup setup) noexcept {
    CommandRegistry::all().emplace_back(order, CommandSetup(std::move(setup)));
  }
};

}  // namespace stowage::tools

#define STOWAGE_CONCAT_INNER(a, b) a##b
#define STOWAGE_CONCAT(a, b) STOWAGE_CONCAT_INNER(a, b)
#define STOWAGE_COMMAND(order, setup) \
  static ::stowage::tools::RegisterCommand STOWAGE_CONCAT(stowage_command_, __LINE__)(order, setup)
