// TensorView: shape/stride arithmetic over a Storage handle, with bounds checked up front.
#include "stowage/tensor.hpp"

#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace stowage {

namespace {

std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> strides(shape.size());
  // Unsigned: an empty tensor may name other dimensions whose product overflows int64.
  std::uint64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = static_cast<std::int64_t>(s);
    s *= shape[i] > 0 ? static_cast<std::uint64_t>(shape[i]) : 1;
  }
  return strides;
}

// Number of elements, or InvalidArgument for a negative extent or an overflow. A 0 anywhere
// gives 0 elements, wherever it sits among dimensions whose product would overflow.
std::int64_t checked_numel(const std::vector<std::int64_t>& shape, std::size_t item) {
  if (std::any_of(shape.begin(), shape.end(), [](std::int64_t d) { return d < 0; }))
    throw InvalidArgument(fmt::format("tensor shape [{}] has a negative dimension", fmt::join(shape, ", ")));
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  std::int64_t n = 1;
  for (auto d : shape) {
    if (n > std::numeric_limits<std::int64_t>::max() / static_cast<std::int64_t>(item) / d)
      throw InvalidArgument(fmt::format("tensor shape [{}] is too large", fmt::join(shape, ", ")));
    n *= d;
  }
  return n;
}

}  // namespace

TensorView::TensorView(Storage storage, DType dtype, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides,
                       std::size_t byte_offset)
    : storage_(std::move(storage)),
      dtype_(dtype),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      byte_offset_(byte_offset) {
  if (!storage_.valid()) throw InvalidArgument("TensorView: empty storage handle");
  const std::size_t item = itemsize(dtype_);
  const std::int64_t n = checked_numel(shape_, item);
  if (strides_.empty()) strides_ = contiguous_strides(shape_);
  if (strides_.size() != shape_.size())
    throw InvalidArgument(fmt::format("TensorView: {} strides for {} dimensions", strides_.size(), shape_.size()));
  if (byte_offset_ % item != 0)
    throw InvalidArgument(fmt::format("TensorView: byte offset {} is not a multiple of the {}-byte {} element",
                                      byte_offset_, item, to_string(dtype_)));
  // The lowest and highest element reached, relative to the first one (strides may be negative).
  __int128 lo = 0, hi = 0;
  if (n > 0)
    for (std::size_t i = 0; i < shape_.size(); ++i) {
      __int128 reach = static_cast<__int128>(strides_[i]) * (shape_[i] - 1);
      (reach < 0 ? lo : hi) += reach;
    }
  const __int128 first = byte_offset_;
  const __int128 begin = first + lo * static_cast<__int128>(item);
  const __int128 end = n > 0 ? first + (hi + 1) * static_cast<__int128>(item) : first;
  if (begin < 0 || end > static_cast<__int128>(storage_.nbytes()))
    throw InvalidArgument(fmt::format(
        "TensorView: {} shape [{}] strides [{}] at byte offset {} reaches bytes [{}, {}) of a {}-byte storage",
        to_string(dtype_), fmt::join(shape_, ", "), fmt::join(strides_, ", "), byte_offset_, begin, end,
        storage_.nbytes()));  // in 128 bits: an extent past 2^63 is printed as it is, not wrapped
}

TensorView TensorView::empty(ResourceHandle resource, DType dtype, std::vector<std::int64_t> shape, Stream stream) {
  const std::size_t item = itemsize(dtype);
  const std::int64_t n = checked_numel(shape, item);
  return TensorView(Storage::allocate(std::move(resource), static_cast<std::size_t>(n) * item, stream), dtype,
                    std::move(shape));
}

std::int64_t TensorView::numel() const {
  if (std::find(shape_.begin(), shape_.end(), 0) != shape_.end()) return 0;  // before any product overflows
  std::int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

std::size_t TensorView::nbytes() const { return static_cast<std::size_t>(numel()) * itemsize(dtype_); }

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;
  std::int64_t expected = 1;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;  // a size-1 dimension's stride does not matter
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* TensorView::data() const {
  if (!storage_.valid()) throw InvalidArgument("TensorView::data: undefined view");
  auto* base = static_cast<std::byte*>(storage_.data());  // InvalidArgument when its resource is gone
  if (!storage_.resident())
    throw InvalidArgument(fmt::format("TensorView::data: storage is {}, not resident", to_string(storage_.state())));
  return base == nullptr ? nullptr : base + byte_offset_;
}

TensorView TensorView::reshape(std::vector<std::int64_t> shape) const {
  if (!is_contiguous())
    throw InvalidArgument(fmt::format("reshape: view with strides [{}] is not contiguous", fmt::join(strides_, ", ")));
  // One dimension may be -1: inferred from the others.
  int inferred = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && inferred < 0) {
      inferred = static_cast<int>(i);
    } else if (shape[i] < 0) {
      throw InvalidArgument(fmt::format("reshape: bad shape [{}]", fmt::join(shape, ", ")));
    } else {
      known *= shape[i];
    }
  }
  if (inferred >= 0) {
    if (known == 0 || numel() % known != 0)
      throw InvalidArgument(fmt::format("reshape: cannot infer [{}] for {} elements", fmt::join(shape, ", "), numel()));
    shape[inferred] = numel() / known;
    known = numel();
  }
  if (known != numel())
    throw InvalidArgument(
        fmt::format("reshape: shape [{}] has {} elements, the view has {}", fmt::join(shape, ", "), known, numel()));
  return TensorView(storage_, dtype_, std::move(shape), {}, byte_offset_);
}

TensorView TensorView::slice(int dim, std::int64_t begin, std::int64_t end) const {
  const int rank = this->dim();
  if (dim < -rank || dim >= rank)
    throw InvalidArgument(fmt::format("slice: dimension {} of a {}-dimensional view", dim, rank));
  if (dim < 0) dim += rank;
  if (begin < 0 || begin > end || end > shape_[dim])
    throw InvalidArgument(fmt::format("slice: [{}, {}) outside dimension {} of size {}", begin, end, dim, shape_[dim]));
  auto shape = shape_;
  shape[dim] = end - begin;
  const std::int64_t offset =
      static_cast<std::int64_t>(byte_offset_) + begin * strides_[dim] * static_cast<std::int64_t>(itemsize(dtype_));
  if (offset < 0) throw InvalidArgument("slice: starts before the storage");  // only with negative strides
  return TensorView(storage_, dtype_, std::move(shape), strides_, static_cast<std::size_t>(offset));
}

TensorView TensorView::view_as(DType dtype) const {
  const auto from = static_cast<std::int64_t>(itemsize(dtype_));
  const auto to = static_cast<std::int64_t>(itemsize(dtype));
  if (from == to) return TensorView(storage_, dtype, shape_, strides_, byte_offset_);
  auto fail = [&](std::string_view why) {
    return InvalidArgument(fmt::format("view_as: {} shape [{}] strides [{}] cannot be seen as {}: {}",
                                       to_string(dtype_), fmt::join(shape_, ", "), fmt::join(strides_, ", "),
                                       to_string(dtype), why));
  };
  if (shape_.empty()) throw fail("a scalar keeps its itemsize");
  if (strides_.back() != 1 && shape_.back() != 1) throw fail("the last dimension is not contiguous");
  if ((shape_.back() * from) % to != 0) throw fail("the last dimension's bytes do not divide evenly");
  if (byte_offset_ % static_cast<std::size_t>(to) != 0) throw fail("the byte offset is misaligned");
  auto shape = shape_;
  auto strides = strides_;
  shape.back() = shape_.back() * from / to;
  strides.back() = 1;
  for (std::size_t i = 0; i + 1 < strides.size(); ++i) {
    if ((strides[i] * from) % to != 0) throw fail("a stride's bytes do not divide evenly");
    strides[i] = strides[i] * from / to;
  }
  return TensorView(storage_, dtype, std::move(shape), std::move(strides), byte_offset_);
}

}  // namespace stowage
