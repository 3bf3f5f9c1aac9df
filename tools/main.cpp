// The `stowage` command: info, estimate, inspect, demo (each in its own file under tools/).
#include <algorithm>
#include <cstdio>
#include <exception>

#include "stowage/error.hpp"
#include "tools/command.hpp"

int main(int argc, char** argv) {
  CLI::App app{"stowage: memory management for large-model training"};
  app.require_subcommand(1);
  int exit_code = 0;
  auto& commands = stowage::tools::CommandRegistry::all();
  std::stable_sort(commands.begin(), commands.end(), [](auto& a, auto& b) { return a.first < b.first; });
  for (auto& [order, setup] : commands) setup(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const stowage::ParseError& e) {
    std::fprintf(stderr, "stowage: %s\n", e.what());
    return 2;
  } catch (const stowage::InvalidArgument& e) {
    std::fprintf(stderr, "stowage: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stowage: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
