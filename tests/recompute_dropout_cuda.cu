// The recompute tests' dropout on CUDA: each element draws its own word of the counter-based
// stream (counter_rng.hpp, constexpr and so callable here), so a recompute draws the same mask.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "stowage/counter_rng.hpp"
#include "stowage/error.hpp"

namespace stowage::testing {
namespace {

constexpr int kThreads = 256;

__global__ void dropout_kernel(RngState rng, float p, std::uint64_t n, const float* x, float* y) {
  const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    y[i] = random_uniform(rng, i) < p ? 0.0f : x[i] / (1.0f - p);
}

}  // namespace

void dropout_cuda(void* stream, RngState rng, float p, std::uint64_t n, const float* x, float* y) {
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>((n + kThreads - 1) / kThreads, 4096));
  dropout_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(rng, p, n, x, y);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw DeviceError(std::string("dropout_cuda launch: ") + cudaGetErrorName(err));
}

}  // namespace stowage::testing
