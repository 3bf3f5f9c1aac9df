// Storage: a shared handle to bytes on a device whose bytes can be released and brought back
// while views keep the handle.
#include "stowage/storage.hpp"

#include <mutex>

#include <fmt/format.h>

#include "common/log.hpp"
#include "stowage/caching_allocator.hpp"

namespace stowage {

const char* to_string(StorageState s) {
  switch (s) {
    case StorageState::resident: return "resident";
    case StorageState::released: return "released";
    case StorageState::swapped_out: return "swapped_out";
  }
  return "unknown";
}

struct Storage::Impl {
  ResourceHandle resource;  // empty: wrapped bytes
  Device* device = nullptr;
  void* data = nullptr;
  std::size_t nbytes = 0;
  StorageState state = StorageState::resident;
  Stream stream = kDefaultStream;
  std::function<void()> deleter;  // wrapped bytes only
  mutable std::mutex mutex;

  // True when the resource was destroyed first: its bytes went with it. Under `mutex` a resident
  // storage then becomes released, so nothing hands out an address that may be another's now.
  bool orphaned() {
    if (!resource.expired()) return false;
    if (state == StorageState::resident) {
      data = nullptr;
      state = StorageState::released;
    }
    return true;
  }

  ~Impl() {
    // Destructors must not throw: a failure here is a bug elsewhere, so it is logged.
    try {
      if (resource.valid()) {
        if (orphaned()) return;  // nothing to give back: the bytes went with the resource
        if (state == StorageState::resident && data != nullptr) resource->deallocate(data, nbytes);
      } else if (deleter) {
        deleter();
      }
    } catch (const std::exception& e) {
      log().error("storage of {} bytes: giving its bytes back failed: {}", nbytes, e.what());
    }
  }
};

Storage Storage::allocate(ResourceHandle resource, std::size_t nbytes, Stream stream) {
  auto impl = std::make_shared<Impl>();
  impl->device = &resource->device();
  impl->nbytes = nbytes;
  impl->stream = stream;
  impl->data = resource->allocate(nbytes, stream);  // the caching allocator records the ScopedTag
  impl->resource = std::move(resource);
  return Storage(std::move(impl));
}

Storage Storage::wrap(Device& device, void* data, std::size_t nbytes, std::function<void()> deleter) {
  if (data == nullptr && nbytes != 0)
    throw InvalidArgument(fmt::format("Storage::wrap: null data for {} bytes", nbytes));
  auto impl = std::make_shared<Impl>();
  impl->device = &device;
  impl->data = data;
  impl->nbytes = nbytes;
  impl->deleter = std::move(deleter);
  return Storage(std::move(impl));
}

static Storage::Impl& checked(const std::shared_ptr<Storage::Impl>& impl) {
  if (!impl) throw InvalidArgument("empty Storage handle");
  return *impl;
}

void* Storage::data() const {
  auto& s = checked(impl_);
  std::lock_guard lock(s.mutex);
  if (s.orphaned()) (void)s.resource.get();  // throws InvalidArgument, saying why
  return s.state == StorageState::resident ? s.data : nullptr;
}

std::size_t Storage::nbytes() const { return checked(impl_).nbytes; }

StorageState Storage::state() const {
  auto& s = checked(impl_);
  std::lock_guard lock(s.mutex);
  (void)s.orphaned();
  return s.state;
}

Device& Storage::device() const { return *checked(impl_).device; }
MemoryResource* Storage::resource() const { return checked(impl_).resource.raw(); }

Stream Storage::stream() const {
  auto& s = checked(impl_);
  std::lock_guard lock(s.mutex);
  return s.stream;
}

void Storage::release(StorageState state) {
  auto& s = checked(impl_);
  if (state == StorageState::resident) throw InvalidArgument("Storage::release: the new state must not be resident");
  std::lock_guard lock(s.mutex);
  if (!s.resource.valid()) throw InvalidArgument("Storage::release: wrapped storage does not own its bytes");
  if (s.orphaned()) (void)s.resource.get();
  if (s.state != StorageState::resident)
    throw InvalidArgument(fmt::format("Storage::release: storage is {}, not resident", to_string(s.state)));
  if (s.data != nullptr) s.resource->deallocate(s.data, s.nbytes);
  s.data = nullptr;
  s.state = state;
}

void Storage::materialize(Stream stream) {
  auto& s = checked(impl_);
  std::lock_guard lock(s.mutex);
  if (!s.resource.valid()) throw InvalidArgument("Storage::materialize: wrapped storage has no memory resource");
  if (s.orphaned()) (void)s.resource.get();
  if (s.state == StorageState::resident) throw InvalidArgument("Storage::materialize: storage is already resident");
  s.data = s.resource->allocate(s.nbytes, stream);  // may throw OutOfMemory: nothing changed
  s.stream = stream;
  s.state = StorageState::resident;
}

void Storage::adopt(void* data, Stream stream) {
  auto& s = checked(impl_);
  std::lock_guard lock(s.mutex);
  if (!s.resource.valid()) throw InvalidArgument("Storage::adopt: wrapped storage has no memory resource");
  if (s.orphaned()) (void)s.resource.get();
  if (s.state == StorageState::resident) throw InvalidArgument("Storage::adopt: storage is already resident");
  if (s.nbytes != 0) {
    if (data == nullptr) throw InvalidArgument("Storage::adopt: null bytes for a non-empty storage");
    // The caching allocator under the resource knows its blocks; other resources are trusted.
    if (const auto* caching = find_resource<CachingAllocator>(s.resource.get())) {
      if (!caching->owns(data))
        throw InvalidArgument("Storage::adopt: the bytes do not come from this storage's allocator");
      if (caching->block_size(data) < s.nbytes)
        throw InvalidArgument(fmt::format("Storage::adopt: block of {} bytes is smaller than the storage ({})",
                                          caching->block_size(data), s.nbytes));
    }
  } else if (data != nullptr) {
    throw InvalidArgument("Storage::adopt: an empty storage takes no bytes");
  }
  s.data = data;
  s.stream = stream;
  s.state = StorageState::resident;
}

}  // namespace stowage
