#pragma once
// A memory resource: where stream-ordered device memory comes from. The caching allocator is
// one; adaptors (statistics, the event log, a limit) wrap any resource and are resources
// themselves, so behaviour is added by composing them (RMM's design), not by flags in one class.
#include <atomic>
#include <concepts>
#include <cstddef>
#include <memory>

#include "stowage/device.hpp"

namespace stowage {

class MemoryResource : public std::enable_shared_from_this<MemoryResource> {
 public:
  virtual ~MemoryResource();
  MemoryResource(const MemoryResource&) = delete;
  MemoryResource& operator=(const MemoryResource&) = delete;

  // The device whose memory this resource hands out.
  virtual Device& device() const = 0;
  // The resource this one forwards to; nullptr for one that draws on the device itself.
  virtual MemoryResource* upstream() const { return nullptr; }

  // `bytes` usable on `stream` at once; nullptr for 0 bytes. OutOfMemory when it cannot, for
  // any size however large (error.hpp); InvalidArgument for a stream that is not valid.
  void* allocate(std::size_t bytes, Stream stream = kDefaultStream) { return do_allocate(bytes, stream); }
  // Returns memory from allocate(). `bytes` is the size it was asked for, or 0 when the caller
  // does not know it (a resource that must know it then looks it up). InvalidArgument for a
  // foreign pointer, a double free or a wrong size; nothing changes then. nullptr is a no-op.
  void deallocate(void* ptr, std::size_t bytes = 0) {
    if (ptr != nullptr) do_deallocate(ptr, bytes);
  }
  // `ptr` is also used on `stream`: its memory is not reused before `stream` reaches this point.
  void record_stream(void* ptr, Stream stream) { do_record_stream(ptr, stream); }

  // Set false by the destructor; holders that cannot keep the resource alive check it.
  std::shared_ptr<const std::atomic<bool>> alive() const { return alive_; }

 protected:
  MemoryResource();
  // An adaptor's first step in each operation, before it takes its lock: DeviceError naming
  // `what` in a process forked from the one that made the resource, where a lock a parent's
  // thread held at the fork stays held and the memory is the parent's.
  void check_not_forked(const char* what) const;
  virtual void* do_allocate(std::size_t bytes, Stream stream) = 0;
  virtual void do_deallocate(void* ptr, std::size_t bytes) = 0;
  virtual void do_record_stream(void* ptr, Stream stream) = 0;

 private:
  std::shared_ptr<std::atomic<bool>> alive_;
  unsigned generation_;  // the process it was made in (how many fork()s from the program's start)
};

// The first resource of type R in the chain that starts at `top` (top itself, its upstream, ...);
// nullptr when there is none. E.g. find_resource<CachingAllocator>(r) for its statistics.
template <class R>
R* find_resource(MemoryResource& top) {
  for (MemoryResource* r = &top; r != nullptr; r = r->upstream()) {
    if (auto* found = dynamic_cast<R*>(r)) return found;
  }
  return nullptr;
}

// How a holder (a Storage, an adaptor, a technique) refers to a resource. When a std::shared_ptr
// owns the resource, the handle shares that ownership and keeps it alive; otherwise (a resource
// on the stack, say) the handle notices when the resource is destroyed, and get() throws
// InvalidArgument instead of touching freed memory.
class ResourceHandle {
 public:
  ResourceHandle() = default;
  ResourceHandle(MemoryResource& resource);                  // NOLINT(google-explicit-constructor): implicit on purpose
  ResourceHandle(std::shared_ptr<MemoryResource> resource);  // NOLINT(google-explicit-constructor)
  template <class R>
  requires std::derived_from<R, MemoryResource> ResourceHandle(
      std::shared_ptr<R> resource)  // NOLINT(google-explicit-constructor)
      : ResourceHandle(std::shared_ptr<MemoryResource>(std::move(resource))) {}

  bool valid() const { return raw_ != nullptr; }
  // True when the handle names a resource that has been destroyed (get() would throw).
  bool expired() const { return alive_ != nullptr && !alive_->load(std::memory_order_acquire); }
  // The resource; InvalidArgument when the handle is empty or the resource was destroyed.
  MemoryResource& get() const;
  MemoryResource* operator->() const { return &get(); }
  // The resource without the liveness check (for messages and identity), nullptr when empty.
  MemoryResource* raw() const { return raw_; }
  bool owning() const { return owner_ != nullptr; }

 private:
  MemoryResource* raw_ = nullptr;
  std::shared_ptr<MemoryResource> owner_;
  std::shared_ptr<const std::atomic<bool>> alive_;
};

}  // namespace stowage
