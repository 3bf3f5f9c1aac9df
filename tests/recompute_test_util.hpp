#pragma once
// Shared pieces of the recompute tests: a small emulated device (make_test_device gives either
// backend), host<->device transfers, a byte hash, and small matmul and dropout kernels run on a
// stream (the CPU loop on the emulated device, recompute_*_cuda.cu on CUDA).
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend_test_util.hpp"
#include "stowage/allocator.hpp"
#include "stowage/counter_rng.hpp"
#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/error.hpp"
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

#ifdef STOWAGE_HAVE_CUDA
// The CUDA kernels behind matmul() and dropout(), launched on `stream` (a cudaStream_t).
// c[m, n] = op(a) op(b); a and b have leading dimensions lda and ldb (their column counts).
void matmul_cuda(void* stream, std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
                 bool ta, const float* b, std::int64_t ldb, bool tb, float* c);
// y[i] = 0 where random_uniform(rng, i) < p, else x[i] / (1 - p).
void dropout_cuda(void* stream, RngState rng, float p, std::uint64_t n, const float* x, float* y);
#endif

// C[m, n] = op(A) op(B), fp32, contiguous row-major; op transposes when asked. On the emulated
// device it runs on the stream's thread; only pointers are captured, as with a real kernel launch.
inline void matmul(Device& dev, Stream s, const TensorView& a, bool ta, const TensorView& b, bool tb,
                   const TensorView& c) {
  const auto m = c.shape()[0], n = c.shape()[1];
  const auto k = ta ? a.shape()[0] : a.shape()[1];
  const float* ap = a.data_as<float>();
  const float* bp = b.data_as<float>();
  float* cp = c.data_as<float>();
  const auto lda = a.shape()[1], ldb = b.shape()[1];
  if (dev.properties().kind == DeviceKind::cuda) {
#ifdef STOWAGE_HAVE_CUDA
    matmul_cuda(native(s), m, n, k, ap, lda, ta, bp, ldb, tb, cp);
    return;
#else
    throw Unsupported("matmul: the tests were built without CUDA");   // CUDA instances skip first
#endif
  }
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

// Dropout of contiguous fp32 x into y with probability p, the mask drawn from `rng`'s
// counter-based stream, so the same state gives the same mask.
inline void dropout(Device& dev, Stream s, RngState rng, float p, const TensorView& x, const TensorView& y) {
  const float* xp = x.data_as<float>();
  float* yp = y.data_as<float>();
  const auto n = static_cast<std::uint64_t>(x.numel());
  if (dev.properties().kind == DeviceKind::cuda) {
#ifdef STOWAGE_HAVE_CUDA
    dropout_cuda(native(s), rng, p, n, xp, yp);
    return;
#else
    throw Unsupported("dropout: the tests were built without CUDA");  // CUDA instances skip first
#endif
  }
  dev.launch_host(s, [=] {
    for (std::uint64_t i = 0; i < n; ++i) yp[i] = random_uniform(rng, i) < p ? 0.0f : xp[i] / (1.0f - p);
  });
}

}  // namespace stowage::testing
