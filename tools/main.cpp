// The `stowage` command: info, estimate, plan, inspect, demo (each in its own file under tools/).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "common/text.hpp"
#include "stowage/error.hpp"
#include "stowage_build_info.hpp"
#include "tools/command.hpp"

namespace {

// CLI11 reads a misspelt subcommand as a stray argument ("A subcommand is required"): name it,
// the closest subcommand, and the list. Empty when argv's first word is fine.
std::string unknown_subcommand(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return {};
  const std::string_view word = argv[1];
  std::string names, best;
  std::size_t best_distance = word.size() / 2 + 1;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == word) return {};
    names += (names.empty() ? "" : ", ") + sub->get_name();
    if (const std::size_t d = stowage::detail::edit_distance(word, sub->get_name()); d < best_distance) {
      best_distance = d;
      best = sub->get_name();
    }
  }
  return "unknown subcommand '" + std::string(word) + "'" + (best.empty() ? "" : " (did you mean " + best + "?)") +
         "; the subcommands are " + names + " (stowage --help)";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stowage: memory management for large-model training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("stowage ") + STOWAGE_VERSION_STRING);
  int exit_code = 0;
  auto& commands = stowage::tools::CommandRegistry::all();
  std::stable_sort(commands.begin(), commands.end(), [](auto& a, auto& b) { return a.first < b.first; });
  for (auto& [order, setup] : commands) setup(app, exit_code);
  if (const std::string unknown = unknown_subcommand(app, argc, argv); !unknown.empty()) {
    std::fprintf(stderr, "stowage: %s\n", unknown.c_str());
    return 2;
  }
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
