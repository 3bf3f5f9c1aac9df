#include "stowage/statistics_resource.hpp"

namespace stowage {

ResourceStatistics StatisticsResource::statistics() const {
  check_not_forked("stowage: StatisticsResource::statistics");
  std::lock_guard lock(mutex_);
  return stats_;
}

void StatisticsResource::reset_peaks() {
  check_not_forked("stowage: StatisticsResource::reset_peaks");
  std::lock_guard lock(mutex_);
  stats_.bytes.reset_peak();
  stats_.allocations.reset_peak();
}

void* StatisticsResource::do_allocate(std::size_t bytes, Stream stream) {
  check_not_forked("stowage: StatisticsResource::allocate");
  std::lock_guard lock(mutex_);
  void* p = upstream_->allocate(bytes, stream);
  if (p == nullptr) return p;
  try {
    live_.emplace(p, bytes);
  } catch (...) {
    upstream_->deallocate(p, bytes);
    throw;
  }
  stats_.bytes.add(static_cast<std::int64_t>(bytes));
  stats_.allocations.add(1);
  return p;
}

void StatisticsResource::do_deallocate(void* ptr, std::size_t bytes) {
  check_not_forked("stowage: StatisticsResource::deallocate");
  std::lock_guard lock(mutex_);
  upstream_->deallocate(ptr, bytes);  // refuses foreign pointers and wrong sizes: nothing counted
  auto it = live_.find(ptr);
  if (it == live_.end()) return;
  stats_.bytes.sub(static_cast<std::int64_t>(it->second));
  stats_.allocations.sub(1);
  live_.erase(it);
}

}  // namespace stowage
