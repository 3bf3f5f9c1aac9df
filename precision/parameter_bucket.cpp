// ParameterBucket: layout, views, fp32 read/write and shards.
#include "stowage/parameter_bucket.hpp"

#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "precision/device_kernels.hpp"
#include "stowage/error.hpp"
#include "stowage/memory_resource.hpp"

namespace stowage {
namespace {

std::size_t checked_numel(const ParameterSpec& p) {
  std::size_t n = 1;
  for (std::int64_t d : p.shape) {
    if (d < 0)
      throw InvalidArgument(
          fmt::format("ParameterBucket: '{}' has a negative dimension in [{}]", p.name, fmt::join(p.shape, ", ")));
    const auto u = static_cast<std::size_t>(d);
    if (u != 0 && n > (std::size_t{1} << 40) / u) {
      throw InvalidArgument(
          fmt::format("ParameterBucket: '{}' of shape [{}] is too large", p.name, fmt::join(p.shape, ", ")));
    }
    n *= u;
  }
  return n;
}

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

ParameterBucket::ParameterBucket(ResourceHandle resource, std::vector<ParameterSpec> params, BucketOptions options,
                                 Stream stream)
    : options_(options), stream_(stream) {
  const std::size_t a = options.align_elements;
  if (a == 0 || a % 8 != 0 || (a & (a - 1)) != 0) {
    throw InvalidArgument(
        fmt::format("ParameterBucket: align_elements must be a power of two and a multiple of 8 (got {})", a));
  }
  if (options.rounding != Rounding::half_up && options.rounding != Rounding::nearest_even) {
    throw InvalidArgument("ParameterBucket: unknown rounding mode");
  }
  std::size_t offset = 0;
  for (auto& p : params) {
    for (const auto& s : slots_) {
      if (s.name == p.name) throw InvalidArgument(fmt::format("ParameterBucket: parameter '{}' appears twice", p.name));
    }
    const std::size_t n = checked_numel(p);
    const std::size_t end = offset + n;
    if (options.capacity_elements != 0 && end > options.capacity_elements) {
      throw InvalidArgument(
          fmt::format("ParameterBucket: '{}' ({} elements at offset {}) overflows the bucket's capacity of {} elements",
                      p.name, n, offset, options.capacity_elements));
    }
    slots_.push_back({std::move(p.name), std::move(p.shape), offset, n});
    offset = round_up(end, a);
  }
  numel_ = options.capacity_elements != 0 ? options.capacity_elements : offset;
  if (numel_ == 0) throw InvalidArgument("ParameterBucket: no elements");
  storage_ = Storage::allocate(std::move(resource), 4 * numel_ + tie_bitmap_bytes(numel_, options.rounding), stream);
  // Zero weights: +0.0 splits into bf16 0, residual 0x8000, tie 0.
  Device& dev = device();
  dev.fill_async(storage_.data(), 0, storage_.nbytes(), stream_);
  auto* residual = reinterpret_cast<std::uint16_t*>(static_cast<char*>(storage_.data()) + 2 * numel_);
  const std::size_t n = numel_;
  detail::device_kernels(dev).fill_u16(dev, stream_, residual, 0x8000, n);
  dev.synchronize(stream_);
}

const ParameterSlot& ParameterBucket::slot(std::size_t i) const {
  if (i >= slots_.size())
    throw InvalidArgument(fmt::format("ParameterBucket: no parameter #{} (it has {})", i, slots_.size()));
  return slots_[i];
}

std::size_t ParameterBucket::index_of(const std::string& name) const {
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].name == name) return i;
  }
  throw InvalidArgument(fmt::format("ParameterBucket: no parameter named '{}'", name));
}

TensorView ParameterBucket::bf16(std::size_t i) const {
  const ParameterSlot& s = slot(i);
  return TensorView(storage_, DType::bf16, s.shape, {}, 2 * s.offset);
}
TensorView ParameterBucket::bf16_plane() const {
  return TensorView(storage_, DType::bf16, {static_cast<std::int64_t>(numel_)});
}
TensorView ParameterBucket::residual_plane() const {
  return TensorView(storage_, DType::u16, {static_cast<std::int64_t>(numel_)}, {}, 2 * numel_);
}
TensorView ParameterBucket::tie_bitmap() const {
  if (options_.rounding != Rounding::nearest_even) return {};
  return TensorView(storage_, DType::u8, {static_cast<std::int64_t>(tie_bitmap_bytes(numel_, options_.rounding))}, {},
                    4 * numel_);
}

SplitPlanes ParameterBucket::planes() const {
  auto* base = static_cast<char*>(storage_.data());
  if (base == nullptr) throw InvalidArgument("ParameterBucket: storage is not resident");
  return SplitPlanes{
      reinterpret_cast<std::uint16_t*>(base), reinterpret_cast<std::uint16_t*>(base + 2 * numel_),
      options_.rounding == Rounding::nearest_even ? reinterpret_cast<std::uint8_t*>(base + 4 * numel_) : nullptr,
      numel_, options_.rounding};
}

namespace {
void check_count(const ParameterSlot& s, const void* p, std::size_t count, const char* fn) {
  if (count != s.numel) {
    throw InvalidArgument(
        fmt::format("ParameterBucket::{}: '{}' has {} elements, {} given", fn, s.name, s.numel, count));
  }
  if (p == nullptr && count != 0) throw InvalidArgument(fmt::format("ParameterBucket::{}: null buffer", fn));
  if (reinterpret_cast<std::uintptr_t>(p) % alignof(float) != 0) {
    throw InvalidArgument(fmt::format("ParameterBucket::{}: buffer {} is not 4-byte aligned", fn, p));
  }
}
}  // namespace

void ParameterBucket::write_fp32(std::size_t i, const float* src, std::size_t count) {
  const ParameterSlot& s = slot(i);
  check_count(s, src, count, "write_fp32");
  if (count == 0) return;
  const SplitPlanes w = planes();
  const std::size_t b = s.offset, e = s.offset + s.numel;
  Device& dev = device();
  const auto& kernels = detail::device_kernels(dev);
  if (dev.properties().host_accessible) {
    kernels.split(dev, stream_, src - b, w, b, e);
    dev.synchronize(stream_);
    return;
  }
  // The kernels read device memory only: stage the host values there first.
  MemoryResource& alloc = *storage_.resource();
  void* staging = alloc.allocate(count * 4, stream_);
  dev.copy_async(staging, src, count * 4, CopyKind::host_to_device, stream_);
  kernels.split(dev, stream_, static_cast<const float*>(staging) - b, w, b, e);
  dev.synchronize(stream_);
  alloc.deallocate(staging, count * 4);
}

void ParameterBucket::read_fp32(std::size_t i, float* dst, std::size_t count) const {
  const ParameterSlot& s = slot(i);
  check_count(s, dst, count, "read_fp32");
  if (count == 0) return;
  const SplitPlanes w = planes();
  const std::size_t b = s.offset, e = s.offset + s.numel;
  Device& dev = device();
  const auto& kernels = detail::device_kernels(dev);
  if (dev.properties().host_accessible) {
    kernels.merge(dev, stream_, w, dst - b, b, e);
    dev.synchronize(stream_);
    return;
  }
  MemoryResource& alloc = *storage_.resource();
  void* staging = alloc.allocate(count * 4, stream_);
  kernels.merge(dev, stream_, w, static_cast<float*>(staging) - b, b, e);
  dev.copy_async(dst, staging, count * 4, CopyKind::device_to_host, stream_);
  dev.synchronize(stream_);
  alloc.deallocate(staging, count * 4);
}

std::pair<std::size_t, std::size_t> ParameterBucket::shard(int rank, int world) const {
  if (world <= 0 || rank < 0 || rank >= world) {
    throw InvalidArgument(fmt::format("ParameterBucket::shard: rank {} of world {}", rank, world));
  }
  const std::size_t a = options_.align_elements;
  const std::size_t units = (numel_ + a - 1) / a;
  const std::size_t per = (units + static_cast<std::size_t>(world) - 1) / static_cast<std::size_t>(world);
  const std::size_t b = std::min(numel_, per * a * static_cast<std::size_t>(rank));
  const std::size_t e = std::min(numel_, per * a * static_cast<std::size_t>(rank + 1));
  return {b, e};
}

}  // namespace stowage
