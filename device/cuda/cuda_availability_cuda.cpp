// With the CUDA backend: how many CUDA devices this process can use, and why none if none.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <mutex>

#include "device/cuda/cuda_device_cuda.hpp"
#include "stowage/cuda_device.hpp"

namespace stowage {
namespace {

struct Availability {
  int count = 0;
  std::string reason;
};

const Availability& availability() {
  static const Availability a = [] {
    Availability r;
    const cudaError_t err = cudaGetDeviceCount(&r.count);
    if (err != cudaSuccess) {
      cudaGetLastError();
      r.count = 0;
      const char* name = cudaGetErrorName(err);
      switch (err) {
        case cudaErrorInsufficientDriver:
          r.reason = fmt::format("no CUDA driver ({}: libcuda.so.1 missing or older than the runtime)", name);
          break;
        case cudaErrorNoDevice: r.reason = fmt::format("no CUDA device ({})", name); break;
        default: r.reason = fmt::format("CUDA unavailable ({}: {})", name, cudaGetErrorString(err)); break;
      }
    } else if (r.count == 0) {
      r.reason = "no CUDA device (the driver reports none)";
    }
    return r;
  }();
  return a;
}

}  // namespace

int cuda_device_count() { return availability().count; }

std::string cuda_unavailable_reason() { return availability().reason; }

std::unique_ptr<Device> make_cuda_device(int ordinal) {
  const Availability& a = availability();
  if (a.count == 0) throw Unsupported(fmt::format("CUDA device {} requested, but {}", ordinal, a.reason));
  if (ordinal < 0 || ordinal >= a.count)
    throw InvalidArgument(
        fmt::format("CUDA device {} requested, but there are {} (0..{})", ordinal, a.count, a.count - 1));
  return std::make_unique<detail::CudaDevice>(ordinal);
}

}  // namespace stowage
