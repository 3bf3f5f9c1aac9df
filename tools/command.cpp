#include "tools/command.hpp"

namespace stowage::tools {

std::vector<std::pair<int, CommandSetup>>& CommandRegistry::all() {
  static std::vector<std::pair<int, CommandSetup>> commands;
  return commands;
}

}  // namespace stowage::tools
