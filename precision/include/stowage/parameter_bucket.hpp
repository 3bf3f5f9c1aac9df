#pragma once
// ParameterBucket: many parameters packed into one flat split-storage buffer (precision.hpp) at
// aligned offsets. One allocation holds the bf16 plane, the residual plane and, in nearest_even
// mode, the tie bitmap; each parameter's bf16 weights are an ordinary bf16 TensorView of it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "stowage/precision.hpp"
#include "stowage/tensor.hpp"

namespace stowage {

struct ParameterSpec {
  std::string name;
  std::vector<std::int64_t> shape;
};

struct BucketOptions {
  Rounding rounding = Rounding::half_up;
  // Every parameter starts at a multiple of this many elements: a power of two of at least 8
  // (8, 16, 32, ...; so shards and parameters never share a tie byte; 64 keeps bf16 views 128-byte
  // aligned). Anything else (0, 12, 24) is an InvalidArgument.
  std::size_t align_elements = 64;
  // 0: as large as the parameters need. Otherwise the bucket's element count, fixed; parameters
  // that do not fit are an InvalidArgument.
  std::size_t capacity_elements = 0;
};

struct ParameterSlot {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t offset = 0;  // first element in the bucket
  std::size_t numel = 0;
};

class ParameterBucket {
 public:
  // Allocates the bucket (zero weights) on `stream`. InvalidArgument for bad shapes, bad
  // alignment or parameters that overflow capacity_elements; nothing is allocated then.
  ParameterBucket(ResourceHandle resource, std::vector<ParameterSpec> params, BucketOptions options = {},
                  Stream stream = kDefaultStream);
  // Move-only: a bucket owns its storage (a copy would share it, and writes through one would
  // change the other). A moved-from bucket is empty: no slots, numel() 0, and the calls that
  // touch its storage throw InvalidArgument.
  ParameterBucket(ParameterBucket&& o) noexcept
      : options_(o.options_),
        slots_(std::exchange(o.slots_, {})),
        numel_(std::exchange(o.numel_, 0)),
        stream_(o.stream_),
        storage_(std::move(o.storage_)) {}
  ParameterBucket& operator=(ParameterBucket&& o) noexcept {
    if (this == &o) return *this;
    options_ = o.options_;
    slots_ = std::exchange(o.slots_, {});
    numel_ = std::exchange(o.numel_, 0);
    stream_ = o.stream_;
    storage_ = std::move(o.storage_);
    return *this;
  }
  ParameterBucket(const ParameterBucket&) = delete;
  ParameterBucket& operator=(const ParameterBucket&) = delete;

  std::size_t size() const { return slots_.size(); }
  std::size_t numel() const { return numel_; }  // elements incl. alignment padding
  Rounding rounding() const { return options_.rounding; }
  const BucketOptions& options() const { return options_; }
  const ParameterSlot& slot(std::size_t i) const;
  std::size_t index_of(const std::string& name) const;  // InvalidArgument when absent
  const Storage& storage() const { return storage_; }
  Stream stream() const { return stream_; }
  Device& device() const { return storage_.device(); }
  // Bytes of the allocation: 4 per element plus the tie bitmap.
  std::size_t nbytes() const { return storage_.nbytes(); }

  // The bf16 weights of parameter i with its shape: an ordinary view for compute and DLPack.
  TensorView bf16(std::size_t i) const;
  TensorView bf16_plane() const;      // [numel] bf16
  TensorView residual_plane() const;  // [numel] u16
  TensorView tie_bitmap() const;      // [tie_bitmap_bytes] u8; undefined in half_up mode

  // Pointers into the planes; the memory is the device's (host-addressable on the emulated one).
  SplitPlanes planes() const;

  // fp32 master of parameter i from / to host memory (count must equal its numel), ordered on
  // the bucket's stream and complete on return.
  void write_fp32(std::size_t i, const float* src, std::size_t count);
  void read_fp32(std::size_t i, float* dst, std::size_t count) const;

  // Elements [begin, end) rank `rank` of `world` updates in a distributed optimizer: equal
  // shares of numel() in units of align_elements (the last ranks may get less or nothing).
  std::pair<std::size_t, std::size_t> shard(int rank, int world) const;

 private:
  BucketOptions options_;
  std::vector<ParameterSlot> slots_;
  std::size_t numel_ = 0;
  Stream stream_{};
  Storage storage_;
};

}  // namespace stowage
