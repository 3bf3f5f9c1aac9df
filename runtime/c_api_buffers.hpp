#pragma once
// What the C ABI's entry points share about the caller's buffers: a size checked, a text copied
// out in snprintf's convention, and a tensor's shape checked into a byte count.
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "stowage/dtype.hpp"

namespace stowage::capi {

// Throws InvalidArgument naming `what` and the size (cold, out of line).
[[noreturn, gnu::visibility("hidden"), gnu::noinline, gnu::cold]] void negative_size(ssize_t size, const char* what);

// A byte count from a signed one; inline, on every allocation and free.
inline std::size_t checked_size(ssize_t size, const char* what) {
  if (size < 0) [[unlikely]]
    negative_size(size, what);
  return static_cast<std::size_t>(size);
}

// InvalidArgument for a null buffer of non-zero length.
[[gnu::visibility("hidden")]] void check_buffer(const char* buf, std::size_t len, const char* what);
// As much of text as fits, NUL-terminated; returns the whole length.
[[gnu::visibility("hidden")]] ssize_t copy_out(const std::string& text, char* buf, std::size_t len);
// The bytes of a contiguous tensor of `shape` (ndim 0 to 64) and dtype; InvalidArgument for a
// null shape, a negative dimension or a size that overflows.
[[gnu::visibility("hidden")]] std::size_t tensor_bytes(const std::int64_t* shape, int ndim, DType dtype,
                                                       const char* what);

}  // namespace stowage::capi
