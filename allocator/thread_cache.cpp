#include "allocator/thread_cache.hpp"

#include <algorithm>

namespace stowage::detail {

bool ThreadCache::affords(const FastDelta& d) const {
  for (int k = 0; k < kFastStats; ++k) {
    const std::int64_t v = d.by_stat[k];
    if (v > 0 && (v > headroom[k][0] || v > headroom[k][d.pool_slot])) return false;
  }
  return true;
}

void ThreadCache::apply(const FastDelta& d) {
  const int pool = d.pool_slot - 1;
  for (int k = 0; k < kFastStats; ++k) {
    const std::int64_t v = d.by_stat[k];
    headroom[k][0] -= v;
    headroom[k][d.pool_slot] -= v;
    current[pool][k] += v;
    if (v > 0) allocated[pool][k] += v;
    else freed[pool][k] -= v;
  }
}

Block* ThreadCache::take(Stream stream, std::size_t key) {
  for (Bin& bin : bins) {
    if (bin.key != key || bin.stream != stream || bin.head == nullptr) continue;
    Block* b = bin.head;
    bin.head = b->cache_next;
    b->cache_next = nullptr;
    --bin.count;
    bytes -= b->size;
    return b;
  }
  return nullptr;
}

bool ThreadCache::put(Block* b, std::size_t key) {
  Bin* target = nullptr;
  Bin* empty = nullptr;
  for (Bin& bin : bins) {
    if (bin.key == key && bin.stream == b->stream) target = &bin;
    if (bin.head == nullptr && empty == nullptr) empty = &bin;
  }
  if (target == nullptr) {
    // A stream no bin names yet has not been checked: the fast path waits until it is.
    if (std::none_of(bins.begin(), bins.end(), [&](const Bin& bin) { return bin.stream == b->stream; }))
      stream_epoch = kUnchecked;
    if (empty != nullptr) {
      *empty = Bin{b->stream, key, nullptr, 0};
      target = empty;
    } else if (bins.size() < kMaxBins) {
      bins.push_back(Bin{b->stream, key, nullptr, 0});
      target = &bins.back();
    } else {
      return false;
    }
  }
  b->cache_next = target->head;
  target->head = b;
  ++target->count;
  bytes += b->size;
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
