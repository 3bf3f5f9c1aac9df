#pragma once
// TensorView: storage + byte offset + dtype + shape + strides (in elements). A view never owns
// bytes directly; it holds the storage handle, so it stays valid when the bytes move.
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "stowage/dtype.hpp"
#include "stowage/storage.hpp"

namespace stowage {

class TensorView {
 public:
  TensorView() = default;
  // Strides empty = contiguous (row-major). InvalidArgument when the view exceeds the storage.
  TensorView(Storage storage, DType dtype, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides = {},
             std::size_t byte_offset = 0);

  // A new contiguous tensor from a memory resource.
  static TensorView empty(ResourceHandle resource, DType dtype, std::vector<std::int64_t> shape,
                          Stream stream = kDefaultStream);

  const Storage& storage() const { return storage_; }
  Storage& storage() { return storage_; }
  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  const std::vector<std::int64_t>& strides() const { return strides_; }
  std::size_t byte_offset() const { return byte_offset_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const;
  std::size_t nbytes() const;  // numel * itemsize
  bool is_contiguous() const;
  bool defined() const { return storage_.valid(); }

  // The first element's address; InvalidArgument when the storage is not resident or the memory
  // resource it came from was destroyed (Storage::data).
  void* data() const;
  template <class T>
  T* data_as() const {
    return static_cast<T*>(data());
  }

  // Same storage, new contiguous shape with the same numel.
  TensorView reshape(std::vector<std::int64_t> shape) const;
  // Elements [begin, end) along dimension `dim`.
  TensorView slice(int dim, std::int64_t begin, std::int64_t end) const;
  // Same bytes seen as another dtype of the same itemsize-times-last-dim extent.
  TensorView view_as(DType dtype) const;

 private:
  Storage storage_;
  DType dtype_ = DType::f32;
  std::vector<std::int64_t> shape_, strides_;
  std::size_t byte_offset_ = 0;
};

}  // namespace stowage
