#include "stowage/device_handles.hpp"

#include "common/log.hpp"

namespace stowage {

void OwnedStream::reset() noexcept {
  if (device_ == nullptr) return;
  try {
    device_->destroy_stream(stream_);
  } catch (const std::exception& e) {
    log().error("destroying a stream failed: {}", e.what());
  }
  device_ = nullptr;
  stream_ = Stream{};
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
}

}  // namespace stowage
