#include "stowage/logging_resource.hpp"

#include "stowage/error.hpp"

namespace stowage {

LoggingResource::LoggingResource(ResourceHandle upstream, std::shared_ptr<EventLog> log)
    : upstream_(std::move(upstream)), log_(std::move(log)) {
  if (!log_) throw InvalidArgument("LoggingResource: no event log");
}

void* LoggingResource::do_allocate(std::size_t bytes, Stream stream) {
  check_not_forked("stowage: LoggingResource::allocate");
  std::lock_guard lock(mutex_);
  void* p = upstream_->allocate(bytes, stream);
  if (p != nullptr) {
    live_[p] = {bytes, stream};
    log_->record(EventAction::allocate, p, bytes, stream);
  }
  return p;
}

void LoggingResource::do_deallocate(void* ptr, std::size_t bytes) {
  check_not_forked("stowage: LoggingResource::deallocate");
  std::lock_guard lock(mutex_);
  upstream_->deallocate(ptr, bytes);  // throws for a foreign pointer: nothing is logged
  std::pair<std::size_t, Stream> info{bytes, kDefaultStream};
  if (auto it = live_.find(ptr); it != live_.end()) {
    info = it->second;  // the size it was allocated with: a free may give 0 or the rounded size
    live_.erase(it);
  }
  log_->record(EventAction::free, ptr, info.first, info.second);
}

}  // namespace stowage
