// Reads the STOWAGE_* environment variables into a typed Config, in this one place.
#include "stowage/config.hpp"

#include "common/text.hpp"
#include "stowage/backends.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <optional>

#include <fmt/format.h>

namespace stowage {

using detail::lower;
using detail::parse_number;
using detail::trim;

static int parse_count(std::string_view text, std::string_view what, int min, int max) {
  std::string_view t = trim(text);
  int value = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), value);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size() || value < min || value > max)
    throw ParseError(fmt::format("{}: '{}' is not a whole number from {} to {}", what, text, min, max));
  return value;
}

Config load_config(const EnvLookup& lookup) {
  Config c;
  auto get = [&](const char* name) -> std::optional<std::string_view> {
    const char* v = lookup ? lookup(name) : nullptr;
    if (v == nullptr) return std::nullopt;
    return std::string_view(v);
  };
  if (auto v = get("STOWAGE_LOG_LEVEL")) c.log_level = parse_log_level(*v, "STOWAGE_LOG_LEVEL");
  if (auto v = get("STOWAGE_DEVICE")) {
    std::string t = lower(trim(*v));
    if (t.empty()) t = "auto";
    if (t != "auto" && find_backend(t) == nullptr)
      throw ParseError(fmt::format("STOWAGE_DEVICE: '{}' is not one of auto, {}", *v, backend_names()));
    c.device = t;
  }
  if (auto v = get("STOWAGE_EMULATED_DEVICES"))
    c.emulated_devices = parse_count(*v, "STOWAGE_EMULATED_DEVICES", 1, 64);
  if (auto v = get("STOWAGE_EMULATED_CAPACITY")) {
    c.emulated.capacity = parse_byte_size(*v, "STOWAGE_EMULATED_CAPACITY");
    if (c.emulated.capacity == 0) throw ParseError("STOWAGE_EMULATED_CAPACITY: must be more than 0 bytes");
  }
  if (auto v = get("STOWAGE_EMULATED_LINK_GBPS")) {
    auto gbps = parse_number(trim(*v));
    if (!gbps)
      throw ParseError(fmt::format("STOWAGE_EMULATED_LINK_GBPS: '{}' is not a number of GB/s (0 = unthrottled)", *v));
    c.emulated.link_bandwidth_gbps = *gbps;
  }
  if (auto v = get("STOWAGE_ALLOC_CONF")) {
    try {
      c.allocator = parse_allocator_options(std::string(*v), c.allocator);
    } catch (const ParseError& e) {
      throw ParseError(fmt::format("STOWAGE_ALLOC_CONF: {}", e.what()));
    }
  }
  if (auto v = get("STOWAGE_EVENT_LOG")) c.event_log = std::string(trim(*v));
  if (auto v = get("STOWAGE_FAULTS")) c.faults = parse_fault_plan(std::string(*v));  // names the variable
  return c;
}

Config load_config_from_environment() {
  return load_config([](const char* name) -> const char* { return std::getenv(name); });
}

const Config& config() {
  // Parsed once; a failure is kept and rethrown, so every caller sees the same answer.
  static std::once_flag once;
  static Config parsed;
  static std::string failure;
  std::call_once(once, [] {
    try {
      parsed = load_config_from_environment();
    } catch (const ParseError& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw ParseError(failure);
  return parsed;
}

}  // namespace stowage
