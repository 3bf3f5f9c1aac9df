// The `stowage` command: info, estimate, plan, inspect, demo (each in its own file under tools/).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

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
  std::vector<std::string_view> subcommands;
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    subcommands.push_back(sub->get_name());
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  if (std::find(subcommands.begin(), subcommands.end(), word) != subcommands.end()) return {};
  // Within half the word's length: a short word's one-letter slip still finds its subcommand.
  const std::string_view near = stowage::detail::nearest(word, subcommands, word.size() / 2).name;
  return "unknown subcommand '" + std::string(word) + "'" +
         (near.empty() ? "" : " (did you mean " + std::string(near) + "?)") + "; the subcommands are " + names +
         " (stowage --help)";
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
