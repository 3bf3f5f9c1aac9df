#pragma once
// Helpers for the inspect tests: the snapshots in tests/data, files written where the build keeps
// its scratch files and read back whole; the command itself through tools_cli_test_util.hpp.
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "tools_cli_test_util.hpp"

namespace stowage::testing {

inline constexpr std::int64_t MiB = 1 << 20;

inline std::string data(const std::string& name) { return std::string(STOWAGE_SOURCE_DIR) + "/tests/data/" + name; }

// Writes `text` to a file in the build folder and returns its path.
inline std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = std::string(STOWAGE_BINARY_DIR) + "/tools_inspect_test_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace stowage::testing
