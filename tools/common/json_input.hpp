#pragma once
// Reading JSON a user hands the command: bounded in size and nesting so hostile input ends in
// a ParseError that names the position, never in a crash or an unbounded allocation.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

namespace stowage::tools {

inline constexpr std::size_t kMaxJsonBytes = std::size_t{64} << 20;
inline constexpr int kMaxJsonDepth = 64;

// ParseError("<what>: ... at byte N") for malformed, truncated, too deep or too large input.
nlohmann::json parse_json(const std::string& text, const std::string& what, std::size_t max_bytes = kMaxJsonBytes);

// The whole file; ParseError when it cannot be read or exceeds max_bytes.
std::string read_file(const std::string& path, std::size_t max_bytes = kMaxJsonBytes);

// Typed field access that names the field on error: "<what>: field 'x' must be an integer".
std::int64_t get_int(const nlohmann::json& obj, const std::string& field, const std::string& what);
std::int64_t get_int_or(const nlohmann::json& obj, const std::string& field, std::int64_t fallback,
                        const std::string& what);
double get_number_or(const nlohmann::json& obj, const std::string& field, double fallback, const std::string& what);
bool get_bool_or(const nlohmann::json& obj, const std::string& field, bool fallback, const std::string& what);
std::string get_string_or(const nlohmann::json& obj, const std::string& field, const std::string& fallback,
                          const std::string& what);

}  // namespace stowage::tools
