#pragma once
// A bounded ring of allocator trace events for snapshots; the oldest entries are overwritten.
#include <chrono>
#include <cstddef>
#include <vector>

#include "stowage/allocator.hpp"

namespace stowage::detail {

class TraceRing {
 public:
  explicit TraceRing(std::size_t capacity) : capacity_(capacity) {}
  bool enabled() const { return capacity_ > 0; }

  void push(TraceAction action, std::uintptr_t address, std::size_t size, Stream stream, const std::string& tag) {
    if (capacity_ == 0) return;
    TraceEntry e{action, address, size, stream, now_ns(), tag};
    if (entries_.size() < capacity_) {
      entries_.push_back(std::move(e));
    } else {
      entries_[next_] = std::move(e);
    }
    next_ = (next_ + 1) % capacity_;
  }

  std::vector<TraceEntry> ordered() const {  // oldest first
    if (entries_.size() < capacity_) return entries_;
    std::vector<TraceEntry> out(entries_.begin() + next_, entries_.end());
    out.insert(out.end(), entries_.begin(), entries_.begin() + next_);
    return out;
  }

  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

 private:
  std::size_t capacity_;
  std::size_t next_ = 0;
  std::vector<TraceEntry> entries_;
};

}  // namespace stowage::detail
