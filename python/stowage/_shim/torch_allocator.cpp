// stowage as PyTorch's CUDA allocator, with what the Python-only CUDAPluggableAllocator path
// cannot wire: record_stream (side-stream use), empty_cache, set_per_process_memory_fraction,
// and an exhausted allocation raised as torch.cuda.OutOfMemoryError with stowage's report.
// Compiled at first use against the installed torch (stowage/torch.py); links libstowage.
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>

#include <array>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include "stowage.h"

namespace {

namespace pluggable = torch::cuda::CUDAPluggableAllocator;

std::string last_error() { return stowage_last_error(); }

void* allocate_or_throw(size_t size, int device, cudaStream_t stream) {
  void* p = stowage_malloc(static_cast<ssize_t>(size), device, stream);
  if (p == nullptr && size != 0) {
    if (stowage_last_error_code() == STOWAGE_ERROR_OUT_OF_MEMORY) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, last_error());
    }
    TORCH_CHECK(false, "stowage: allocation of ", size, " bytes on device ", device, " failed: ", last_error());
  }
  return p;
}

// size 0: "unknown"; stowage knows the block's size, and the block's own stream orders the free.
void release(void* p, size_t size, int device) {
  stowage_free(p, static_cast<ssize_t>(size), device, nullptr);
  // A deleter cannot throw: a refused free (changing nothing) is a warning.
  if (stowage_last_error_code() != STOWAGE_OK) TORCH_WARN("stowage: free of ", p, " refused: ", last_error());
}

// PyTorch's pluggable allocator keeps each block's size, device and stream in a hash map behind a
// mutex, for its deleter, which reaches it through the current allocator. stowage knows its
// blocks, so nothing here files them: a tensor's memory carries a deleter made for its device
// (devices from kDirectDevices on: raw_deleter()), and raw_delete frees on the owner's device.
constexpr int kDirectDevices = 64;

template <int D>
void free_on_device(void* p) {
  release(p, 0, D);
}

template <std::size_t... D>
constexpr std::array<c10::DeleterFnPtr, sizeof...(D)> deleters_for(std::index_sequence<D...>) {
  return {&free_on_device<static_cast<int>(D)>...};
}
constexpr auto kDeleters = deleters_for(std::make_index_sequence<kDirectDevices>{});

bool direct(c10::DeviceIndex device) { return device >= 0 && device < kDirectDevices; }

c10::DataPtr allocate_on_current_device(size_t size, c10::DeleterFnPtr other_deleter) {
  const c10::DeviceIndex device = c10::cuda::current_device();
  void* p = allocate_or_throw(size, device, c10::cuda::getCurrentCUDAStream(device));
  const c10::DeleterFnPtr deleter = direct(device) ? kDeleters[static_cast<std::size_t>(device)] : other_deleter;
  return {p, p, deleter, c10::Device(c10::DeviceType::CUDA, device)};
}

// c10::Allocator::allocate was const before PyTorch 2.3; the form this torch declares is
// overridden (a partial specialization is compiled only when chosen, so `override` checks it).
constexpr bool kConstAllocate =
    std::is_same_v<decltype(&c10::Allocator::allocate), c10::DataPtr (c10::Allocator::*)(size_t) const>;

template <bool Const, class Base = pluggable::CUDAPluggableAllocator>
struct Allocator;

// raw_alloc's blocks (and raw_allocate()'s, which c10::Allocator takes from allocate() and gives
// back through raw_deleter(), which calls raw_delete) are freed on the device that owns them.
template <class Base>
struct Unfiled : Base {
  using Base::Base;
  void* raw_alloc(size_t size) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    return allocate_or_throw(size, device, c10::cuda::getCurrentCUDAStream(device));
  }
  void* raw_alloc_with_stream(size_t size, cudaStream_t stream) override {
    return allocate_or_throw(size, c10::cuda::current_device(), stream);
  }
  void raw_delete(void* p) override { release(p, 0, -1); }
};

template <class Base>
struct Allocator<false, Base> : Unfiled<Base> {
  using Unfiled<Base>::Unfiled;
  c10::DataPtr allocate(size_t size) override { return allocate_on_current_device(size, this->raw_deleter()); }
};

template <class Base>
struct Allocator<true, Base> : Unfiled<Base> {
  using Unfiled<Base>::Unfiled;
  c10::DataPtr allocate(size_t size) const override { return allocate_on_current_device(size, this->raw_deleter()); }
};

using StowageAllocator = Allocator<kConstAllocate>;

void install() {
  TORCH_CHECK(stowage_using_cuda() == 1,
              "stowage: libstowage is not using CUDA here (built without CUDA, no usable GPU, or "
              "STOWAGE_DEVICE=emulated): ",
              last_error());
  TORCH_CHECK(stowage_device_count() > 0, "stowage: no devices: ", last_error());
  auto allocator = std::make_shared<StowageAllocator>(
      allocate_or_throw, [](void* p, size_t size, int device, cudaStream_t) { release(p, size, device); });
  allocator->init(0);  // as createCustomAllocator does (PyTorch calls init again when CUDA starts)
  // As PyTorch's own allocator: nothing to record for an empty tensor (NULL) or memory another
  // allocator gave (from_dlpack, CUDA IPC); NCCL records every input and output.
  allocator->set_record_stream_fn([](void* ptr, cudaStream_t stream) {
    if (ptr == nullptr) return;
    const int device = stowage_block_device(ptr);
    TORCH_CHECK(device >= 0 || stowage_last_error_code() == STOWAGE_OK, "stowage: record_stream: ", last_error());
    if (device < 0) return;
    TORCH_CHECK(stowage_record_stream(ptr, device, stream) == 0, "stowage: record_stream: ", last_error());
  });
  allocator->set_reset_fn([] { TORCH_CHECK(stowage_empty_cache(-1) == 0, "stowage: empty_cache: ", last_error()); });
  allocator->set_memory_fraction_fn([](double fraction, int device) {
    TORCH_CHECK(stowage_set_memory_fraction(device, fraction) == 0,
                "stowage: set_per_process_memory_fraction: ", last_error());
  });
  allocator->set_init_fn([](int) { TORCH_CHECK(stowage_device_count() > 0, "stowage: ", last_error()); });
  pluggable::changeCurrentAllocator(allocator);
}

// Whether memory PyTorch's current CUDA allocator gives on `device` goes back to stowage through
// the device's own deleter (not the pluggable map).
bool frees_directly(int device) {
  TORCH_CHECK(device >= 0 && device < kDirectDevices && device < stowage_device_count(),
              "stowage: frees_directly: no device ", device);
  const auto index = static_cast<c10::DeviceIndex>(device);
  c10::cuda::CUDAGuard guard(index);
  const c10::DataPtr p = c10::cuda::CUDACachingAllocator::get()->allocate(1);
  return p.get_deleter() == kDeleters[static_cast<std::size_t>(device)];
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install, "Makes stowage the current CUDA allocator (before any CUDA allocation).");
  m.def("frees_directly", &frees_directly, "Whether a tensor's memory on the device goes back to stowage directly.");
}
