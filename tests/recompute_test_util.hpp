#pragma once
// Shared pieces of the recompute tests: an emulated device with an allocator, host<->device
// transfers, a byte hash, and a small CPU matmul run on a stream.
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/device.hpp"
#include "stowage/tensor.hpp"

namespace stowage::testing {

inline std::unique_ptr<Device> small_device(std::size_t capacity = std::size_t{256} << 20) {
  EmulatedOptions o;
  o.capacity = capacity;
  return make_emulated_device(0, o);
}

// Copies host values into a resident tensor (stream-ordered; waits so `values` may go).
template <class T>
void upload(Device& dev, const TensorView& t, const std::vector<T>& values, Stream s) {
  dev.copy_async(t.data(), values.data(), values.size() * sizeof(T), CopyKind::host_to_device, s);
  dev.synchronize(s);
}

inline std::vector<std::uint8_t> download(Device& dev, const TensorView& t, Stream s) {
  std::vector<std::uint8_t> out(t.nbytes());
  dev.copy_async(out.data(), t.data(), out.size(), CopyKind::device_to_host, s);
  dev.synchronize(s);
  return out;
}

inline std::uint64_t fnv1a(const std::vector<std::uint8_t>& bytes) {
  std::uint64_t h = 1469598103934665603ull;
  for (auto b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

inline std::vector<float> normal_values(std::size_t n, unsigned seed, float sigma = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(gen);
  return v;
}

// C[m, n] = op(A) op(B), fp32, contiguous row-major; op transposes when asked. Runs on the
// stream's thread; only pointers are captured, as with a real kernel launch.
inline void matmul(Device& dev, Stream s, const TensorView& a, bool ta, const TensorView& b, bool tb,
                   const TensorView& c) {
  const auto m = c.shape()[0], n = c.shape()[1];
  const auto k = ta ? a.shape()[0] : a.shape()[1];
  const float* ap = a.data_as<float>();
  const float* bp = b.data_as<float>();
  float* cp = c.data_as<float>();
  const auto lda = a.shape()[1], ldb = b.shape()[1];
  dev.launch_host(s, [=] {
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (std::int64_t p = 0; p < k; ++p)
          acc += (ta ? ap[p * lda + i] : ap[i * lda + p]) * (tb ? bp[j * ldb + p] : bp[p * ldb + j]);
        cp[i * n + j] = acc;
      }
  });
}

}  // namespace stowage::testing
