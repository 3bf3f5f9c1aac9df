#pragma once
// What the C ABI's entry points share about the caller's buffers: a text copied out in
// snprintf's convention, and a tensor's shape checked into a byte count.
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "stowage/dtype.hpp"

namespace stowage::capi {

// InvalidArgument for a null buffer of non-zero length.
[[gnu::visibility("hidden")]] void check_buffer(const char* buf, std::size_t len, const char* what);
// As much of text as fits, NUL-terminated; returns the whole length.
[[gnu::visibility("hidden")]] ssize_t copy_out(const std::string& text, char* buf, std::size_t len);
// The bytes of a contiguous tensor of `shape` (ndim 0 to 64) and dtype; InvalidArgument for a
// null shape, a negative dimension or a size that overflows.
[[gnu::visibility("hidden")]] std::size_t tensor_bytes(const std::int64_t* shape, int ndim, DType dtype,
                                                       const char* what);

}  // namespace stowage::capi
