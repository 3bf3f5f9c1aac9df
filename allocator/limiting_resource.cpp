#include "stowage/limiting_resource.hpp"

#include <fmt/format.h>

#include "stowage/byte_size.hpp"
#include "stowage/error.hpp"

namespace stowage {

std::size_t LimitingResource::limit() const {
  check_not_forked("stowage: LimitingResource::limit");
  std::lock_guard lock(mutex_);
  return limit_;
}

void LimitingResource::set_limit(std::size_t bytes) {
  check_not_forked("stowage: LimitingResource::set_limit");
  std::lock_guard lock(mutex_);
  limit_ = bytes;
}

std::size_t LimitingResource::allocated() const {
  check_not_forked("stowage: LimitingResource::allocated");
  std::lock_guard lock(mutex_);
  return allocated_;
}

void* LimitingResource::do_allocate(std::size_t bytes, Stream stream) {
  check_not_forked("stowage: LimitingResource::allocate");
  std::lock_guard lock(mutex_);
  if (bytes > limit_ || allocated_ > limit_ - bytes) {
    throw OutOfMemory(fmt::format(
        "stowage: limit reached: tried to allocate {} ({} bytes) with {} of the limit of {} in use; raise the "
        "limit or free memory",
        format_bytes(bytes), bytes, format_bytes(allocated_), format_bytes(limit_)));
  }
  void* p = upstream_->allocate(bytes, stream);
  if (p == nullptr) return p;
  try {
    live_.emplace(p, bytes);
  } catch (...) {
    upstream_->deallocate(p, bytes);
    throw;
  }
  allocated_ += bytes;
  return p;
}

void LimitingResource::do_deallocate(void* ptr, std::size_t bytes) {
  check_not_forked("stowage: LimitingResource::deallocate");
  std::lock_guard lock(mutex_);
  upstream_->deallocate(ptr, bytes);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;
  allocated_ -= it->second;
  live_.erase(it);
}

}  // namespace stowage
