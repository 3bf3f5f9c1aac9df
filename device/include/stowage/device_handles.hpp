#pragma once
// Streams and events owned by an object: destroyed with it, so an exception between create and
// destroy (a half-built technique, say) leaves nothing behind. Move-only. Each is attached to its
// device (Device::attach): the device must outlive it.
#include <utility>

#include "stowage/device.hpp"

namespace stowage {

class OwnedStream {
 public:
  OwnedStream() = default;
  explicit OwnedStream(Device& device, int priority = 0);
  ~OwnedStream() { reset(); }
  OwnedStream(OwnedStream&& other) noexcept
      : device_(std::exchange(other.device_, nullptr)),
        stream_(std::exchange(other.stream_, Stream{})),
        use_(std::move(other.use_)) {}
  OwnedStream& operator=(OwnedStream&& other) noexcept {
    if (this != &other) {
      reset();
      device_ = std::exchange(other.device_, nullptr);
      stream_ = std::exchange(other.stream_, Stream{});
      use_ = std::move(other.use_);
    }
    return *this;
  }

  Stream get() const { return stream_; }
  operator Stream() const { return stream_; }  // NOLINT(google-explicit-constructor): a handle is its stream
  bool owns() const { return device_ != nullptr; }
  // Destroys the stream now (queued work still runs); failures are logged, never thrown.
  void reset() noexcept;

 private:
  Device* device_ = nullptr;
  Stream stream_{};
  Dependency use_;
};

class OwnedEvent {
 public:
  OwnedEvent() = default;
  explicit OwnedEvent(Device& device, bool timing = false);
  ~OwnedEvent() { reset(); }
  OwnedEvent(OwnedEvent&& other) noexcept
      : device_(std::exchange(other.device_, nullptr)),
        event_(std::exchange(other.event_, Event{})),
        use_(std::move(other.use_)) {}
  OwnedEvent& operator=(OwnedEvent&& other) noexcept {
    if (this != &other) {
      reset();
      device_ = std::exchange(other.device_, nullptr);
      event_ = std::exchange(other.event_, Event{});
      use_ = std::move(other.use_);
    }
    return *this;
  }

  Event get() const { return event_; }
  operator Event() const { return event_; }  // NOLINT(google-explicit-constructor): a handle is its event
  bool owns() const { return device_ != nullptr; }
  void reset() noexcept;

 private:
  Device* device_ = nullptr;
  Event event_{};
  Dependency use_;
};

}  // namespace stowage
