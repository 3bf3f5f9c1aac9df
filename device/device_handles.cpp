#include "stowage/device_handles.hpp"

#include <fmt/format.h>

#include "common/log.hpp"

namespace stowage {

OwnedStream::OwnedStream(Device& device, int priority) : device_(&device), stream_(device.create_stream(priority)) {
  try {
    use_ = device.attach(fmt::format("OwnedStream (stream {})", static_cast<std::uintptr_t>(stream_)));
  } catch (...) {
    reset();
    throw;
  }
}

OwnedEvent::OwnedEvent(Device& device, bool timing) : device_(&device), event_(device.create_event(timing)) {
  try {
    use_ = device.attach(fmt::format("OwnedEvent (event {})", static_cast<std::uintptr_t>(event_)));
  } catch (...) {
    reset();
    throw;
  }
}

void OwnedStream::reset() noexcept {
  if (device_ == nullptr) return;
  try {
    device_->destroy_stream(stream_);
  } catch (const std::exception& e) {
    log().error("destroying a stream failed: {}", e.what());
  }
  device_ = nullptr;
  stream_ = Stream{};
  use_.reset();
}

void OwnedEvent::reset() noexcept {
  if (device_ == nullptr) return;
  try {
    device_->destroy_event(event_);
  } catch (const std::exception& e) {
    log().error("destroying an event failed: {}", e.what());
  }
  device_ = nullptr;
  event_ = Event{};
  use_.reset();
}

}  // namespace stowage
