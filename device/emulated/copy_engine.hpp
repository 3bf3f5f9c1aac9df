#pragma once
// An emulated copy engine: one direction of the host↔device link, optionally throttled to a
// bandwidth so that compute/copy overlap can be measured on a CPU.
//
// The link is a schedule, not a thread: a copy occupies it from when its stream was ready (on
// the stream's logical clock) or when the copy before it left the link, whichever is later, for
// bytes / bandwidth, and its bytes are in place no earlier than that. Copies from several streams
// share the one link in the order they reach it, as on a GPU's copy engine.
#include <cstddef>
#include <mutex>

#include "device/emulated/stream_worker.hpp"

namespace stowage::emulated {

class CopyEngine {
 public:
  explicit CopyEngine(double bandwidth_gbps) : bytes_per_ns_(bandwidth_gbps) {}
  bool throttled() const { return bytes_per_ns_ > 0; }
  double bandwidth_gbps() const { return bytes_per_ns_; }
  // Copies on the calling stream's thread; returns when the link has carried the bytes, with
  // the logical time at which it did. `ready`: when the stream reached the copy.
  Clock::time_point copy(void* dst, const void* src, std::size_t bytes, Clock::time_point ready);

 private:
  double bytes_per_ns_;  // GB/s == bytes per ns; 0 = unthrottled
  std::mutex mutex_;
  Clock::time_point link_free_{};
};

}  // namespace stowage::emulated
