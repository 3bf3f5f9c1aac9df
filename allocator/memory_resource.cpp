#include "stowage/memory_resource.hpp"

#include "common/fork_generation.hpp"
#include "stowage/error.hpp"

namespace stowage {

MemoryResource::MemoryResource() : alive_(std::make_shared<std::atomic<bool>>(true)), generation_(fork_generation()) {}

void MemoryResource::check_not_forked(const char* what) const {
  if (forked_since(generation_)) refuse_in_forked_child(what);
}

MemoryResource::~MemoryResource() { alive_->store(false, std::memory_order_release); }

ResourceHandle::ResourceHandle(MemoryResource& resource)
    : raw_(&resource), owner_(resource.weak_from_this().lock()), alive_(resource.alive()) {}

ResourceHandle::ResourceHandle(std::shared_ptr<MemoryResource> resource)
    : raw_(resource.get()), owner_(std::move(resource)), alive_(raw_ ? raw_->alive() : nullptr) {}

MemoryResource& ResourceHandle::get() const {
  if (raw_ == nullptr) throw InvalidArgument("no memory resource (an empty handle)");
  if (!alive_->load(std::memory_order_acquire)) {
    throw InvalidArgument(
        "the memory resource this memory came from was destroyed first; destroy storages, tensors and "
        "techniques before their allocator, or own the allocator with a std::shared_ptr (handles then keep it "
        "alive)");
  }
  return *raw_;
}

}  // namespace stowage
