#include "allocator/thread_cache.hpp"

#include <algorithm>

namespace stowage::detail {

bool ThreadCache::put(Block* b, std::size_t key) {
  Bin* target = find(b->stream, key);
  if (target == nullptr) {
    // A stream no bin names yet has not been checked: the fast path waits until it is.
    if (std::none_of(bins.begin(), bins.end(), [&](const Bin& bin) { return bin.stream == b->stream; }))
      stream_epoch = kUnchecked;
    const auto empty = std::find_if(bins.begin(), bins.end(), [](const Bin& bin) { return bin.head == nullptr; });
    if (empty != bins.end()) {
      *empty = Bin{b->stream, key, nullptr, 0};
      target = &*empty;
    } else if (bins.size() < kMaxBins) {
      bins.push_back(Bin{b->stream, key, nullptr, 0});
      target = &bins.back();
    } else {
      return false;
    }
  }
  push(*target, b);
  return true;
}

bool ThreadCache::can_put(Stream stream, std::size_t key) const {
  if (bins.size() < kMaxBins) return true;
  for (const Bin& bin : bins)
    if ((bin.key == key && bin.stream == stream) || bin.head == nullptr) return true;
  return false;
}

std::vector<Block*> ThreadCache::take_all() {
  std::vector<Block*> out;
  for (Bin& bin : bins) {
    for (Block* b = bin.head; b != nullptr;) {
      Block* next = b->cache_next;
      b->cache_next = nullptr;
      out.push_back(b);
      b = next;
    }
    bin.head = nullptr;
    bin.count = 0;
  }
  bytes = 0;
  return out;
}

}  // namespace stowage::detail
