#include "allocator/copy_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

namespace stowage::emulated {

std::future<void> CopyEngine::submit(void* dst, const void* src, std::size_t bytes) {
  auto done = std::make_shared<std::promise<void>>();
  auto result = done->get_future();
  worker_.submit([this, dst, src, bytes, done] {
    if (bytes_per_ns_ <= 0) {
      std::memmove(dst, src, bytes);
      done->set_value();
      return;
    }
    // Copy in chunks and sleep so the bytes arrive no faster than the link allows.
    constexpr std::size_t kChunk = std::size_t{1} << 20;
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t off = 0; off < bytes; off += kChunk) {
      const std::size_t n = std::min(kChunk, bytes - off);
      std::memmove(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, n);
      const auto due = start + std::chrono::nanoseconds(static_cast<long long>((off + n) / bytes_per_ns_));
      std::this_thread::sleep_until(due);
    }
    done->set_value();
  });
  return result;
}

}  // namespace stowage::emulated
