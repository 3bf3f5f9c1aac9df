#include "tools/common/json_input.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/json_depth.hpp"
#include "stowage/error.hpp"

namespace stowage::tools {

nlohmann::json parse_json(const std::string& text, const std::string& what, std::size_t max_bytes) {
  if (text.size() > max_bytes)
    throw ParseError(fmt::format("{}: input is {} bytes, more than the limit of {}", what, text.size(), max_bytes));
  // Bounded nesting keeps destruction and later recursive walks bounded; checked by one pass
  // over the bytes, so the parse itself is the plain (fast) one.
  if (const auto at = detail::json_too_deep_at(text, kMaxJsonDepth))
    throw ParseError(fmt::format("{}: nesting deeper than {} levels at byte {}", what, kMaxJsonDepth, *at));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw ParseError(fmt::format("{}: malformed JSON at byte {}: {}", what, e.byte, e.what()));
  } catch (const nlohmann::json::exception& e) {  // e.g. a number beyond double's range
    throw ParseError(fmt::format("{}: unreadable JSON: {}", what, e.what()));
  }
}

std::string read_file(const std::string& path, std::size_t max_bytes) {
  std::error_code ec;  // a directory opens, then reads as nothing: say what it is
  if (std::filesystem::is_directory(path, ec))
    throw ParseError(fmt::format("cannot read '{}': it is a directory", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ParseError(fmt::format("cannot open '{}'", path));
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<std::size_t>(in.gcount()));
    if (text.size() > max_bytes)
      throw ParseError(fmt::format("'{}' is larger than the limit of {} bytes", path, max_bytes));
  }
  return text;
}

namespace {
const nlohmann::json* field_of(const nlohmann::json& obj, const std::string& field, const std::string& what) {
  if (!obj.is_object()) throw ParseError(fmt::format("{}: expected a JSON object", what));
  auto it = obj.find(field);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}
}  // namespace

std::int64_t get_int(const nlohmann::json& obj, const std::string& field, const std::string& what) {
  const auto* v = field_of(obj, field, what);
  if (!v) throw ParseError(fmt::format("{}: field '{}' is missing", what, field));
  // Unsigned first: is_number_integer() holds for unsigned numbers too, and 2^63 and above would wrap.
  if (v->is_number_unsigned()) {
    auto u = v->get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      throw ParseError(fmt::format("{}: field '{}' is too large", what, field));
    return static_cast<std::int64_t>(u);
  }
  if (v->is_number_integer()) return v->get<std::int64_t>();
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) return static_cast<std::int64_t>(d);
  }
  throw ParseError(fmt::format("{}: field '{}' must be an integer", what, field));
}

std::int64_t get_int_or(const nlohmann::json& obj, const std::string& field, std::int64_t fallback,
                        const std::string& what) {
  return field_of(obj, field, what) ? get_int(obj, field, what) : fallback;
}

double get_number_or(const nlohmann::json& obj, const std::string& field, double fallback, const std::string& what) {
  const auto* v = field_of(obj, field, what);
  if (!v) return fallback;
  if (!v->is_number()) throw ParseError(fmt::format("{}: field '{}' must be a number", what, field));
  return v->get<double>();
}

bool get_bool_or(const nlohmann::json& obj, const std::string& field, bool fallback, const std::string& what) {
  const auto* v = field_of(obj, field, what);
  if (!v) return fallback;
  if (!v->is_boolean()) throw ParseError(fmt::format("{}: field '{}' must be true or false", what, field));
  return v->get<bool>();
}

std::string get_string_or(const nlohmann::json& obj, const std::string& field, const std::string& fallback,
                          const std::string& what) {
  const auto* v = field_of(obj, field, what);
  if (!v) return fallback;
  if (!v->is_string()) throw ParseError(fmt::format("{}: field '{}' must be a string", what, field));
  return v->get<std::string>();
}

}  // namespace stowage::tools
