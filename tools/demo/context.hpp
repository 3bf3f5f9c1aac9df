#pragma once
// What the demo's training code runs on: a device, its allocator, and the compute stream on
// which every CPU kernel is launched (device.launch_host), so copies and techniques that order
// themselves against the compute stream see kernels exactly as they would on a GPU.
#include <functional>
#include <utility>

#include "stowage/allocator.hpp"
#include "stowage/device.hpp"
#include "stowage/tensor.hpp"

namespace stowage::demo {

struct Context {
  Device* device = nullptr;
  CachingAllocator* allocator = nullptr;
  Stream compute = kDefaultStream;

  void launch(std::function<void()> kernel) const { device->launch_host(compute, std::move(kernel)); }
  void sync() const { device->synchronize(compute); }
  TensorView f32(std::vector<std::int64_t> shape) const {
    return TensorView::empty(*allocator, DType::f32, std::move(shape), compute);
  }
};

inline float* f32_ptr(const TensorView& t) { return t.data_as<float>(); }

}  // namespace stowage::demo
