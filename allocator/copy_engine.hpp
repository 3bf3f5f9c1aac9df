#pragma once
// An emulated copy engine: one queue of copies (H2D or D2H), optionally throttled to a link
// bandwidth so that compute/copy overlap can be measured on a CPU.
#include <cstddef>
#include <future>

#include "allocator/stream_worker.hpp"

namespace stowage::emulated {

class CopyEngine {
 public:
  explicit CopyEngine(double bandwidth_gbps) : bytes_per_ns_(bandwidth_gbps), worker_(0) {}
  // Queues a copy; the future is ready when the bytes have arrived.
  std::future<void> submit(void* dst, const void* src, std::size_t bytes);
  void synchronize() { worker_.synchronize(); }
  double bandwidth_gbps() const { return bytes_per_ns_; }

 private:
  double bytes_per_ns_;  // GB/s == bytes per ns; 0 = unthrottled
  StreamWorker worker_;
};

}  // namespace stowage::emulated
