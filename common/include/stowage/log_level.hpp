#pragma once
// The levels of stowage's log (STOWAGE_LOG_LEVEL; off by default).
#include <string_view>

namespace stowage {

enum class LogLevel { trace, debug, info, warn, error, critical, off };
const char* to_string(LogLevel level);

// "trace", "debug", "info", "warn"/"warning", "error"/"err", "critical", "off" or "" (off), any
// case. ParseError mentioning `what` on anything else.
LogLevel parse_log_level(std::string_view text, std::string_view what = "log level");

// The level of stowage's log (stderr): STOWAGE_LOG_LEVEL until set here.
LogLevel log_level();
void set_log_level(LogLevel level);

}  // namespace stowage
