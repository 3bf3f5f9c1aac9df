// stowage as PyTorch's CUDA allocator, with what the Python-only CUDAPluggableAllocator path
// cannot wire: record_stream (side-stream use), empty_cache, set_per_process_memory_fraction,
// and an exhausted allocation raised as torch.cuda.OutOfMemoryError with stowage's report.
// Compiled at first use against the installed torch (stowage/torch.py); links libstowage.
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>

#include <string>

#include "stowage.h"

namespace {

std::string last_error() { return stowage_last_error(); }

void* allocate(size_t size, int device, cudaStream_t stream) {
  void* p = stowage_malloc(static_cast<ssize_t>(size), device, stream);
  if (p == nullptr && size != 0) {
    if (stowage_last_error_code() == STOWAGE_ERROR_OUT_OF_MEMORY) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, last_error());
    }
    TORCH_CHECK(false, "stowage: allocation of ", size, " bytes on device ", device, " failed: ", last_error());
  }
  return p;
}

void release(void* p, size_t size, int device, cudaStream_t stream) {
  stowage_free(p, static_cast<ssize_t>(size), device, stream);
  // A deleter cannot throw: a refused free (changing nothing) is a warning.
  if (stowage_last_error_code() != STOWAGE_OK) TORCH_WARN("stowage: free of ", p, " refused: ", last_error());
}

void install() {
  TORCH_CHECK(stowage_using_cuda() == 1,
              "stowage: libstowage is not using CUDA here (built without CUDA, no usable GPU, or "
              "STOWAGE_DEVICE=emulated): ",
              last_error());
  TORCH_CHECK(stowage_device_count() > 0, "stowage: no devices: ", last_error());
  namespace pluggable = torch::cuda::CUDAPluggableAllocator;
  auto allocator = pluggable::createCustomAllocator(allocate, release);
  auto* p = dynamic_cast<pluggable::CUDAPluggableAllocator*>(allocator.get());
  TORCH_CHECK(p != nullptr, "stowage: torch's createCustomAllocator did not make a CUDAPluggableAllocator");
  p->set_record_stream_fn([](void* ptr, cudaStream_t stream) {
    TORCH_CHECK(stowage_record_stream(ptr, -1, stream) == 0, "stowage: record_stream: ", last_error());
  });
  p->set_reset_fn([] { TORCH_CHECK(stowage_empty_cache(-1) == 0, "stowage: empty_cache: ", last_error()); });
  p->set_memory_fraction_fn([](double fraction, int device) {
    TORCH_CHECK(stowage_set_memory_fraction(device, fraction) == 0,
                "stowage: set_per_process_memory_fraction: ", last_error());
  });
  p->set_init_fn([](int) { TORCH_CHECK(stowage_device_count() > 0, "stowage: ", last_error()); });
  pluggable::changeCurrentAllocator(allocator);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install, "Makes stowage the current CUDA allocator (before any CUDA allocation).");
}
