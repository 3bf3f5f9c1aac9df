// Reads the STOWAGE_* environment variables into a typed Config, in this one place.
#include "stowage/config.hpp"

#include "common/text.hpp"
#include "stowage/backends.hpp"
#include "stowage/error.hpp"
#include "stowage/event_log.hpp"

#include <unistd.h>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <vector>

#include <fmt/format.h>

namespace stowage {

using detail::lower;
using detail::Nearest;
using detail::nearest;
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
  if (auto v = get("STOWAGE_EMULATED_DEVICES")) c.emulated_devices = parse_count(*v, "STOWAGE_EMULATED_DEVICES", 1, 64);
  if (auto v = get("STOWAGE_EMULATED_CAPACITY")) {
    c.emulated.capacity = parse_byte_size(*v, "STOWAGE_EMULATED_CAPACITY");
    if (c.emulated.capacity == 0) throw ParseError("STOWAGE_EMULATED_CAPACITY: must be more than 0 bytes");
    if (c.emulated.capacity > kMaxEmulatedCapacity)
      throw ParseError(
          fmt::format("STOWAGE_EMULATED_CAPACITY: '{}' is more than the 128TiB a process can address", *v));
  }
  if (auto v = get("STOWAGE_EMULATED_LINK_GBPS")) {
    auto gbps = parse_number(trim(*v));
    if (!gbps || (*gbps != 0 && !(*gbps >= kMinLinkGbps && *gbps <= kMaxLinkGbps)))
      throw ParseError(
          fmt::format("STOWAGE_EMULATED_LINK_GBPS: '{}' is not 0 (unthrottled) or a number of GB/s "
                      "from {} to {}",
                      *v, kMinLinkGbps, kMaxLinkGbps));
    c.emulated.link_bandwidth_gbps = *gbps;
  }
  if (auto v = get("STOWAGE_ALLOC_CONF")) {
    try {
      c.allocator = parse_allocator_options(std::string(*v), c.allocator, &c.warnings);
    } catch (const ParseError& e) {
      throw ParseError(fmt::format("STOWAGE_ALLOC_CONF: {}", e.what()));
    }
  }
  if (auto v = get("STOWAGE_EVENT_LOG")) {
    c.event_log = std::string(trim(*v));
    try {
      (void)expand_event_log_path(c.event_log);  // its placeholders checked now, not at the first allocation
    } catch (const InvalidArgument& e) {
      throw ParseError(fmt::format("STOWAGE_EVENT_LOG: {}", e.what()));
    }
  }
  if (auto v = get("STOWAGE_FAULTS")) c.faults = parse_fault_plan(std::string(*v));  // names the variable
  return c;
}

Config load_config_from_environment() {
  return load_config([](const char* name) -> const char* { return std::getenv(name); });
}

namespace {

// What stowage reads: the library's variables, and those of its tools and Python package.
constexpr std::string_view kKnownVariables[] = {"STOWAGE_LOG_LEVEL",
                                                "STOWAGE_DEVICE",
                                                "STOWAGE_EMULATED_DEVICES",
                                                "STOWAGE_EMULATED_CAPACITY",
                                                "STOWAGE_EMULATED_LINK_GBPS",
                                                "STOWAGE_ALLOC_CONF",
                                                "STOWAGE_EVENT_LOG",
                                                "STOWAGE_FAULTS",
                                                "STOWAGE_SIMD",
                                                "STOWAGE_LIBRARY",
                                                "STOWAGE_WERROR"};

}  // namespace

std::vector<std::string> unknown_variable_warnings(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const std::string& name : names) {
    if (!name.starts_with("STOWAGE_")) continue;
    // The project's own test and benchmark switches are not configuration.
    if (name.starts_with("STOWAGE_BENCH_") || name.starts_with("STOWAGE_TEST_") || name.ends_with("_TEST_CHILD"))
      continue;
    const Nearest near = nearest(name, kKnownVariables, 3);
    if (!near.name.empty() && near.distance == 0) continue;  // known
    out.push_back(
        !near.name.empty()
            ? fmt::format("{} is not a stowage variable (did you mean {}?); it is ignored", name, near.name)
            : fmt::format("{} is not a stowage variable; it is ignored (docs/configuration.md lists them)", name));
  }
  return out;
}

const Config& config() {
  // Parsed once; a failure is kept and rethrown, so every caller sees the same answer. Never
  // destroyed, as the allocators and devices are not: a static destructor or a thread still
  // running at exit may make the first allocation then.
  static std::once_flag once;
  static Config& parsed = *new Config;             // NOLINT(cppcoreguidelines-owning-memory)
  static std::string& failure = *new std::string;  // NOLINT(cppcoreguidelines-owning-memory)
  std::call_once(once, [] {
    // A misspelt variable would be ignored without a word: say so once, even with logging off.
    std::vector<std::string> names;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      const std::string_view entry(*e);
      names.emplace_back(entry.substr(0, entry.find('=')));
    }
    for (const std::string& w : unknown_variable_warnings(names)) std::fprintf(stderr, "stowage: %s\n", w.c_str());
    try {
      parsed = load_config_from_environment();
      for (const std::string& w : parsed.warnings) std::fprintf(stderr, "stowage: STOWAGE_ALLOC_CONF: %s\n", w.c_str());
    } catch (const ParseError& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw ParseError(failure);
  return parsed;
}

}  // namespace stowage
