#pragma once
// DLPack export and import, so PyTorch, JAX, NumPy and CuPy can wrap a view without a copy.
#include <dlpack/dlpack.h>

#include "stowage/tensor.hpp"

namespace stowage {

// A DLManagedTensor whose deleter keeps the view's storage alive until the consumer calls it.
// InvalidArgument when the storage is not resident.
DLManagedTensor* to_dlpack(const TensorView& view);
// Takes ownership of `tensor` (its deleter runs when the last storage handle goes). The device
// is the stowage device the data lives on (ignored for kDLCPU data, which becomes host memory).
TensorView from_dlpack(DLManagedTensor* tensor, Device& device);
// The stowage dtype of a DLPack data type; Unsupported, naming `what`, when there is none.
DType dtype_from_dlpack(DLDataType type, const char* what = "from_dlpack");

}  // namespace stowage
