// A small shared library that tests/integration/torch_dlpack.py loads with ctypes: it makes
// stowage tensors on an emulated device and hands them out as DLPack tensors, so that PyTorch's
// own from_dlpack can be checked against them. Every function returns null / -1 on error and
// leaves the message for probe_last_error().
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "stowage/allocator.hpp"
#include "stowage/dlpack.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/parameter_bucket.hpp"

namespace {

struct Probe {
  std::unique_ptr<stowage::Device> device =
      stowage::make_emulated_device(0, stowage::EmulatedOptions{.capacity = 64 << 20});
  stowage::CachingAllocator allocator{*device};
};

Probe& probe() {
  static Probe p;
  return p;
}

thread_local std::string last_error;

template <typename F>
auto guarded(F&& f, decltype(f()) on_error) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    last_error = e.what();
    return on_error;
  }
}

}  // namespace

extern "C" {

// A [rows, cols] f32 tensor with element k (row-major) = k * 0.25 - 3, exported as its column
// slice [col_begin, col_end), so the consumer sees non-contiguous strides. *data receives the
// address of the slice's first element.
__attribute__((visibility("default"))) void* probe_iota_f32(std::int64_t rows, std::int64_t cols,
                                                            std::int64_t col_begin, std::int64_t col_end, void** data) {
  return guarded(
      [&]() -> void* {
        stowage::TensorView t = stowage::TensorView::empty(probe().allocator, stowage::DType::f32, {rows, cols});
        auto* p = t.data_as<float>();
        for (std::int64_t k = 0; k < rows * cols; ++k) p[k] = static_cast<float>(k) * 0.25f - 3.0f;
        stowage::TensorView s = t.slice(1, col_begin, col_end);
        *data = s.data();
        return stowage::to_dlpack(s);  // the views die here; the DLPack tensor keeps the storage
      },
      nullptr);
}

// The bf16 plane of a one-parameter split-storage bucket holding `values` as its fp32 master
// (nearest_even != 0 selects IEEE round-to-nearest-even), exported as a bf16 tensor of shape [n].
__attribute__((visibility("default"))) void* probe_bf16_weights(const float* values, std::int64_t n, int nearest_even) {
  return guarded(
      [&]() -> void* {
        stowage::BucketOptions options;
        options.rounding = nearest_even != 0 ? stowage::Rounding::nearest_even : stowage::Rounding::half_up;
        stowage::ParameterBucket bucket(probe().allocator, {{"w", {n}}}, options);
        bucket.write_fp32(0, values, static_cast<std::size_t>(n));
        return stowage::to_dlpack(bucket.bf16(0));
      },
      nullptr);
}

// Bytes the probe's allocator has handed out and not had back.
__attribute__((visibility("default"))) std::int64_t probe_allocated_bytes() {
  return guarded([] { return probe().allocator.stats().allocated_bytes.all.current; }, std::int64_t{-1});
}

__attribute__((visibility("default"))) const char* probe_last_error() { return last_error.c_str(); }

}  // extern "C"
