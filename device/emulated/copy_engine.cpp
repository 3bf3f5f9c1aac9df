#include "device/emulated/copy_engine.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

namespace stowage::emulated {

Clock::time_point CopyEngine::copy(void* dst, const void* src, std::size_t bytes, Clock::time_point ready) {
  if (!throttled()) {
    std::memmove(dst, src, bytes);
    return Clock::now();
  }
  const auto at = [this](std::size_t n) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::nano>(n / bytes_per_ns_));
  };
  Clock::time_point start;
  {
    std::lock_guard lock(mutex_);
    start = std::max(ready, link_free_);
    link_free_ = start + at(bytes);
  }
  // Copy in chunks and sleep so the bytes arrive no faster than the link allows.
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  for (std::size_t off = 0; off < bytes; off += kChunk) {
    const std::size_t n = std::min(kChunk, bytes - off);
    std::memmove(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, n);
    std::this_thread::sleep_until(start + at(off + n));
  }
  return start + at(bytes);
}

}  // namespace stowage::emulated
