// Without the CUDA backend there are no CUDA devices; with it, cuda_device_*_cuda.cpp defines these.
#ifndef STOWAGE_HAVE_CUDA
#include "stowage/cuda_device.hpp"
#include "stowage/device.hpp"

namespace stowage {

int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return "built without CUDA"; }
std::unique_ptr<Device> make_cuda_device(int ordinal) {
  throw Unsupported("CUDA device " + std::to_string(ordinal) + " requested, but stowage was built without CUDA");
}

}  // namespace stowage
#endif
