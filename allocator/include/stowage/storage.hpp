#pragma once
// Storage: a reference-counted handle to bytes on a device. The bytes behind it can move
// (released for recomputation, swapped out to host, brought back elsewhere) while every view
// that holds the handle stays valid.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "stowage/device.hpp"
#include "stowage/memory_resource.hpp"

namespace stowage {

enum class StorageState { resident, released, swapped_out };
const char* to_string(StorageState s);

class Storage {
 public:
  Storage() = default;  // an empty handle: valid() is false

  // nbytes from a memory resource (the caching allocator, or any adaptor over it), usable on
  // `stream`. The storage holds the resource through a ResourceHandle: it keeps a resource owned
  // by a std::shared_ptr alive, and refuses, with InvalidArgument, to use one destroyed first.
  // A resource destroyed first takes the bytes with it (another allocator may hand out the same
  // addresses): the storage then reports `released`, and data(), release(), materialize() and
  // adopt() throw InvalidArgument, so no view can reach memory that is no longer its own.
  static Storage allocate(ResourceHandle resource, std::size_t nbytes, Stream stream = kDefaultStream);
  // Bytes stowage does not own (a DLPack import, a host buffer); `deleter` runs when the last
  // handle goes. Such a storage cannot be released or moved.
  static Storage wrap(Device& device, void* data, std::size_t nbytes, std::function<void()> deleter);

  bool valid() const { return impl_ != nullptr; }
  // nullptr unless resident; InvalidArgument when the resource it came from was destroyed.
  void* data() const;
  std::size_t nbytes() const;
  StorageState state() const;
  bool resident() const { return state() == StorageState::resident; }
  Device& device() const;
  // nullptr for wrapped storage. For identity: the resource may have been destroyed since.
  MemoryResource* resource() const;
  Stream stream() const;  // the stream the bytes are used on
  long use_count() const { return impl_.use_count(); }
  bool same_as(const Storage& other) const { return impl_ == other.impl_; }
  const void* id() const { return impl_.get(); }

  // --- for techniques that move bytes (recompute, swap); not for ordinary users ---
  // Gives the bytes back to the resource (stream-ordered on stream()), keeping nbytes; the
  // state becomes `state`. InvalidArgument when not resident or wrapped.
  void release(StorageState state = StorageState::released);
  // Fresh bytes from the resource on `stream` (contents undefined); state becomes resident.
  void materialize(Stream stream);
  // Puts bytes the caller allocated from resource() (nbytes() long, usable on `stream`) in
  // place; InvalidArgument when already resident.
  void adopt(void* data, Stream stream);

  struct Impl;

 private:
  explicit Storage(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace stowage
