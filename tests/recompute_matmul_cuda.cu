// The recompute tests' matmul on CUDA: the CPU helper's loop order, one thread per output element,
// so the same inputs give the same bits on every run (what a bit-identical recompute needs). nvcc
// may fuse its multiply-adds, so the bits differ from the CPU helper's; tests compare within one
// backend.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "stowage/error.hpp"

namespace stowage::testing {
namespace {

constexpr int kThreads = 256;

// c[i, j] = sum over p, in order, of op(a)[i, p] * op(b)[p, j].
__global__ void matmul_kernel(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda, bool ta,
                              const float* b, std::int64_t ldb, bool tb, float* c) {
  const std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= m * n) return;
  const std::int64_t i = idx / n, j = idx % n;
  float acc = 0.0f;
  for (std::int64_t p = 0; p < k; ++p)
    acc += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
  c[idx] = acc;
}

}  // namespace

void matmul_cuda(void* stream, std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
                 bool ta, const float* b, std::int64_t ldb, bool tb, float* c) {
  if (m * n == 0) return;
  const auto blocks = static_cast<unsigned>((m * n + kThreads - 1) / kThreads);
  matmul_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(m, n, k, a, lda, ta, b, ldb, tb, c);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw DeviceError(std::string("matmul_cuda launch: ") + cudaGetErrorName(err));
}

}  // namespace stowage::testing
