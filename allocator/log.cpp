// The "stowage" spdlog logger, writing to stderr at the configured level.
#include "allocator/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>

#include "stowage/config.hpp"

namespace stowage {

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

}  // namespace stowage
