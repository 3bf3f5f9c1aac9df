// Without the CUDA backend the precision layer's CUDA kernels exist only to say so.
#if !defined(STOWAGE_HAVE_CUDA)
#include <fmt/format.h>

#include "precision/cuda_kernels.hpp"
#include "stowage/error.hpp"

namespace stowage::cuda_precision {
namespace {
[[noreturn]] void no_cuda(const char* fn) {
  throw Unsupported(fmt::format("cuda_precision::{}: stowage was built without CUDA", fn));
}
}  // namespace
CurrentDevice::CurrentDevice(int) {}  // the kernels below say there is no CUDA
CurrentDevice::~CurrentDevice() = default;
void fill_u16(std::uint16_t*, std::uint16_t, std::size_t, void*) { no_cuda("fill_u16"); }
void split(const float*, const SplitPlanes&, std::size_t, std::size_t, void*) { no_cuda("split"); }
void merge(const SplitPlanes&, float*, std::size_t, std::size_t, void*) { no_cuda("merge"); }
void any_nonfinite(const void*, bool, std::size_t, std::size_t, int*, void*) { no_cuda("any_nonfinite"); }
void adam(const detail::AdamArgs&, std::size_t, std::size_t, void*) { no_cuda("adam"); }
void adam_fp32(const detail::AdamArgs&, float*, std::size_t, std::size_t, void*) { no_cuda("adam_fp32"); }
void sgd(const detail::SgdArgs&, std::size_t, std::size_t, void*) { no_cuda("sgd"); }
}  // namespace stowage::cuda_precision
#endif
