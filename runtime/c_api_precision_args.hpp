#pragma once
// The C ABI's precision arguments as stowage's types, checked (InvalidArgument), for the entry
// points of c_api_precision.cpp and c_api_multi_step.cpp.
#include <cstdint>

#include "stowage/device_optimizers.hpp"
#include "stowage/memory_resource.hpp"
#include "stowage/optimizers.hpp"
#include "stowage/precision.hpp"
#include "stowage/stowage.h"

namespace stowage::capi {

[[gnu::visibility("hidden")]] SplitPlanes planes_of(const stowage_split_planes* p, const char* what);
[[gnu::visibility("hidden")]] HostGrad grad_of(const void* grad, int bits, const char* what);
// NULL: no loss scale, no clipping, non-finite gradients skip the step. The values are checked
// by the steps themselves.
[[gnu::visibility("hidden")]] GradScaling scaling_of(const stowage_grad_scaling* s);
[[gnu::visibility("hidden")]] AdamOptions adam_options_of(const stowage_adam_options* o, const char* what);
[[gnu::visibility("hidden")]] SgdOptions sgd_options_of(const stowage_sgd_options* o, const char* what);
[[gnu::visibility("hidden")]] OptimizerState state_of(std::int64_t step, const char* what);
inline DeviceGrad device_grad(const HostGrad& g) { return DeviceGrad{g.data, g.dtype}; }
// The stream of an _async call on `device`, checked before anything is queued: an ordinal that
// names no device, or a stream never created or already destroyed, is refused.
[[gnu::visibility("hidden")]] Stream stream_of(int device, void* stream);

// The finite check's flag in the device's memory, from the C ABI's allocator of that device, only
// when the step checks (a framework that checks for itself never makes that allocator); given
// back when the step returns (the check has been waited for).
class [[gnu::visibility("hidden")]] Flag {
 public:
  Flag(int device, Stream stream, bool needed);
  ~Flag();
  Flag(const Flag&) = delete;
  Flag& operator=(const Flag&) = delete;
  int* get() const { return ptr_; }

 private:
  MemoryResource* from_ = nullptr;
  int* ptr_ = nullptr;
};

}  // namespace stowage::capi
