// Reads the STOWAGE_* environment variables into a typed Config, in this one place.
#include "stowage/config.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <optional>

#include <fmt/format.h>

namespace stowage {

const char* to_string(LogLevel level) {
  switch (level) {
    case LogLevel::trace: return "trace";
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warn: return "warn";
    case LogLevel::error: return "error";
    case LogLevel::critical: return "critical";
    case LogLevel::off: return "off";
  }
  return "unknown";
}

const char* to_string(DeviceChoice choice) {
  switch (choice) {
    case DeviceChoice::automatic: return "auto";
    case DeviceChoice::cuda: return "cuda";
    case DeviceChoice::emulated: return "emulated";
  }
  return "unknown";
}

static std::string lower(std::string_view text) {
  std::string out(text);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

static std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// A finite, non-negative decimal number taking the whole text.
static std::optional<double> parse_number(std::string_view text) {
  if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text.front())) || text.front() == '.'))
    return std::nullopt;
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::size_t parse_byte_size(std::string_view text, std::string_view what) {
  auto fail = [&](std::string_view why) {
    return ParseError(fmt::format("{}: '{}' is not a byte size ({}); use e.g. 4096, 512MiB, 8GiB",
                                  what, text, why));
  };
  std::string_view t = trim(text);
  std::size_t split = 0;
  while (split < t.size() && (std::isdigit(static_cast<unsigned char>(t[split])) || t[split] == '.')) ++split;
  std::string_view digits = t.substr(0, split);
  std::string unit = lower(trim(t.substr(split)));
  auto number = parse_number(digits);
  if (!number) throw fail("no number");
  static constexpr struct { const char* name; double factor; } units[] = {
      {"", 1}, {"b", 1},
      {"k", 0x1p10}, {"kib", 0x1p10}, {"kb", 1e3},
      {"m", 0x1p20}, {"mib", 0x1p20}, {"mb", 1e6},
      {"g", 0x1p30}, {"gib", 0x1p30}, {"gb", 1e9},
      {"t", 0x1p40}, {"tib", 0x1p40}, {"tb", 1e12}};
  for (const auto& u : units) {
    if (unit != u.name) continue;
    double bytes = *number * u.factor;
    if (bytes >= 0x1p64) throw fail("too large");
    if (bytes != std::floor(bytes)) throw fail("not a whole number of bytes");
    return static_cast<std::size_t>(bytes);
  }
  throw fail(fmt::format("unknown unit '{}'", unit));
}

LogLevel parse_log_level(std::string_view text, std::string_view what) {
  std::string t = lower(trim(text));
  static constexpr struct { const char* name; LogLevel level; } names[] = {
      {"trace", LogLevel::trace}, {"debug", LogLevel::debug}, {"info", LogLevel::info},
      {"warn", LogLevel::warn}, {"warning", LogLevel::warn}, {"error", LogLevel::error},
      {"err", LogLevel::error}, {"critical", LogLevel::critical}, {"off", LogLevel::off},
      {"", LogLevel::off}};
  for (const auto& n : names)
    if (t == n.name) return n.level;
  throw ParseError(fmt::format("{}: '{}' is not a log level (trace, debug, info, warn, error, critical, off)",
                               what, text));
}

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
    if (t == "auto" || t.empty()) c.device = DeviceChoice::automatic;
    else if (t == "cuda") c.device = DeviceChoice::cuda;
    else if (t == "emulated") c.device = DeviceChoice::emulated;
    else throw ParseError(fmt::format("STOWAGE_DEVICE: '{}' is not one of auto, cuda, emulated", *v));
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
