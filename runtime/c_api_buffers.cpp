#include "runtime/c_api_buffers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "stowage/error.hpp"

namespace stowage::capi {

void negative_size(ssize_t size, const char* what) {
  throw InvalidArgument(fmt::format("{}: negative size {}", what, static_cast<long long>(size)));
}

void check_buffer(const char* buf, std::size_t len, const char* what) {
  if (buf == nullptr && len != 0) throw InvalidArgument(fmt::format("{}: null buffer of non-zero length", what));
}

ssize_t copy_out(const std::string& text, char* buf, std::size_t len) {
  if (len > 0) {
    const std::size_t n = std::min(len - 1, text.size());
    text.copy(buf, n);
    buf[n] = '\0';
  }
  return static_cast<ssize_t>(text.size());
}

std::size_t tensor_bytes(const std::int64_t* shape, int ndim, DType dtype, const char* what) {
  if (ndim < 0 || ndim > 64) throw InvalidArgument(fmt::format("{}: ndim {} is not 0 to 64", what, ndim));
  if (shape == nullptr && ndim > 0) throw InvalidArgument(fmt::format("{}: null shape", what));
  // A 0 anywhere makes the tensor empty, whatever the other dimensions multiply to: the overflow
  // check comes after the whole shape has been read, so the 0's place does not matter.
  bool empty = false;
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] < 0) throw InvalidArgument(fmt::format("{}: negative dimension {}", what, shape[i]));
    empty = empty || shape[i] == 0;
  }
  if (empty) return 0;
  // A tensor's byte size is an int64 to DLPack's consumers and to torch: past 2^63 - 1 it overflows,
  // whatever size_t holds (the device and host exports agree on that).
  constexpr auto kMost = static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max());
  std::size_t bytes = itemsize(dtype);
  for (int i = 0; i < ndim; ++i) {
    const auto d = static_cast<std::size_t>(shape[i]);
    if (bytes > kMost / d) throw InvalidArgument(fmt::format("{}: the tensor's size overflows", what));
    bytes *= d;
  }
  return bytes;
}

}  // namespace stowage::capi
