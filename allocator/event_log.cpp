// EventLog: the CSV through an spdlog file sink.
#include "stowage/event_log.hpp"

#include <chrono>
#include <fstream>
#include <mutex>

#include <fmt/format.h>
#include <spdlog/logger.h>
#include <spdlog/sinks/basic_file_sink.h>

namespace stowage {

const char* to_string(EventAction action) { return action == EventAction::allocate ? "allocate" : "free"; }

struct EventLog::Impl {
  std::string path;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::unique_ptr<spdlog::logger> logger;
};

EventLog::EventLog(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  {
    // The header goes in first, then the sink appends the records after it.
    std::ofstream out(path, std::ios::trunc);
    if (!out) throw InvalidArgument(fmt::format("event log: cannot open '{}' for writing", path));
    out << kEventLogHeader << '\n';
  }
  try {
    auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
    impl_->logger = std::make_unique<spdlog::logger>("stowage.event_log", std::move(sink));
  } catch (const spdlog::spdlog_ex& e) {
    throw InvalidArgument(fmt::format("event log: cannot open '{}': {}", path, e.what()));
  }
  impl_->logger->set_pattern("%t,%v", spdlog::pattern_time_type::local);
  impl_->logger->set_level(spdlog::level::info);
  impl_->logger->flush_on(spdlog::level::info);
}

EventLog::~EventLog() = default;

const std::string& EventLog::path() const { return impl_->path; }

void EventLog::record(EventAction action, const void* pointer, std::size_t size, Stream stream) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - impl_->start).count();
  impl_->logger->info("{:.9f},{},{:#x},{},{}", seconds, to_string(action), reinterpret_cast<std::uintptr_t>(pointer),
                      size, static_cast<std::uint64_t>(stream));
}

}  // namespace stowage
