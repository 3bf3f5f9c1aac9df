// The "stowage" spdlog logger, writing to stderr at the configured level, and the log levels.
#include "common/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>

#include <fmt/format.h>

#include "common/text.hpp"
#include "stowage/error.hpp"
#include "stowage/log_level.hpp"

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

LogLevel parse_log_level(std::string_view text, std::string_view what) {
  std::string t = detail::lower(detail::trim(text));
  static constexpr struct {
    const char* name;
    LogLevel level;
  } names[] = {{"trace", LogLevel::trace}, {"debug", LogLevel::debug},       {"info", LogLevel::info},
               {"warn", LogLevel::warn},   {"warning", LogLevel::warn},      {"error", LogLevel::error},
               {"err", LogLevel::error},   {"critical", LogLevel::critical}, {"off", LogLevel::off},
               {"", LogLevel::off}};
  for (const auto& n : names)
    if (t == n.name) return n.level;
  throw ParseError(
      fmt::format("{}: '{}' is not a log level (trace, debug, info, warn, error, critical, off)", what, text));
}

static spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::trace: return spdlog::level::trace;
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::warn: return spdlog::level::warn;
    case LogLevel::error: return spdlog::level::err;
    case LogLevel::critical: return spdlog::level::critical;
    case LogLevel::off: return spdlog::level::off;
  }
  return spdlog::level::off;
}

spdlog::logger& log() {
  // Not registered with spdlog's global registry, so a host program's own "stowage" logger or
  // spdlog::drop_all() cannot clash with it. Leaked on purpose: usable from static destructors.
  static spdlog::logger* logger = [] {
    auto* l = new spdlog::logger("stowage", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [stowage] [%l] %v");
    // Only STOWAGE_LOG_LEVEL, not config(): parsing the rest may itself log.
    try {
      const char* text = std::getenv("STOWAGE_LOG_LEVEL");
      l->set_level(to_spdlog(text ? parse_log_level(text, "STOWAGE_LOG_LEVEL") : LogLevel::off));
    } catch (const std::exception& e) {
      // A malformed STOWAGE_* variable: the logger still works, and says so once.
      l->set_level(spdlog::level::warn);
      l->warn("{} (logging at level warn)", e.what());
    }
    return l;
  }();
  return *logger;
}

static LogLevel from_spdlog(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace: return LogLevel::trace;
    case spdlog::level::debug: return LogLevel::debug;
    case spdlog::level::info: return LogLevel::info;
    case spdlog::level::warn: return LogLevel::warn;
    case spdlog::level::err: return LogLevel::error;
    case spdlog::level::critical: return LogLevel::critical;
    default: return LogLevel::off;
  }
}

LogLevel log_level() { return from_spdlog(log().level()); }
void set_log_level(LogLevel level) { log().set_level(to_spdlog(level)); }

}  // namespace stowage
