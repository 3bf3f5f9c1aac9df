#pragma once
// Helpers for the offload tests: deterministic contents, hashes, and "kernels" on a stream.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "backend_test_util.hpp"
#include "stowage/device.hpp"
#include "stowage/tensor.hpp"

namespace stowage::testing {

inline std::uint64_t splitmix(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The bytes a tensor filled with `seed` holds.
inline void pattern(void* p, std::size_t n, std::uint64_t seed) {
  auto* b = static_cast<unsigned char*>(p);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t v = splitmix(seed);
    std::memcpy(b + i, &v, 8);
  }
  if (i < n) {
    const std::uint64_t v = splitmix(seed);
    std::memcpy(b + i, &v, n - i);
  }
}

inline std::uint64_t hash_bytes(const void* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t v;
    std::memcpy(&v, b + i, 8);
    h = (h ^ v) * 1099511628211ull;
  }
  for (; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

inline std::uint64_t expected_hash(std::size_t n, std::uint64_t seed) {
  auto buf = std::make_unique<unsigned char[]>(n);
  pattern(buf.get(), n, seed);
  return hash_bytes(buf.get(), n);
}

// A "kernel" filling the tensor's bytes on `stream` (the pointer is taken now, as on a GPU).
inline void fill_on(Device& d, Stream s, const TensorView& v, std::uint64_t seed) {
  void* p = v.data();
  const std::size_t n = v.nbytes();
  d.launch_host(s, [p, n, seed] { pattern(p, n, seed); });
}

// A "kernel" hashing the tensor's bytes on `stream` into *out.
inline void hash_on(Device& d, Stream s, const TensorView& v, std::uint64_t* out) {
  const void* p = v.data();
  const std::size_t n = v.nbytes();
  d.launch_host(s, [p, n, out] { *out = hash_bytes(p, n); });
}

// The same two "kernels" through the device's copies, for a device whose memory the host cannot
// touch (a GPU): the bytes go through a host buffer that the stream itself lets go after the copy.
inline void upload_on(Device& d, Stream s, const TensorView& v, std::uint64_t seed) {
  auto host = std::make_shared<std::vector<unsigned char>>(v.nbytes());
  pattern(host->data(), host->size(), seed);
  d.copy_async(v.data(), host->data(), host->size(), CopyKind::host_to_device, s);
  d.launch_host(s, [host] {});
}

inline void download_hash_on(Device& d, Stream s, const TensorView& v, std::uint64_t* out) {
  auto host = std::make_shared<std::vector<unsigned char>>(v.nbytes());
  d.copy_async(host->data(), v.data(), host->size(), CopyKind::device_to_host, s);
  d.launch_host(s, [host, out] { *out = hash_bytes(host->data(), host->size()); });
}

// A "kernel" that keeps the stream busy for `us` microseconds.
inline void busy_on(Device& d, Stream s, int us) {
  d.launch_host(s, [us] { std::this_thread::sleep_for(std::chrono::microseconds(us)); });
}

}  // namespace stowage::testing
