#pragma once
// The library's spdlog logger, named "stowage"; its level comes from STOWAGE_LOG_LEVEL (off by
// default). Private to the library: the public headers do not expose spdlog.
#include <spdlog/spdlog.h>

namespace stowage {

spdlog::logger& log();

}  // namespace stowage
