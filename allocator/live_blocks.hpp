#pragma once
// Live (allocated) blocks by address, in shards with a lock each, so threads that allocate and
// free at once rarely meet: the caching allocator's fast path finds and files blocks here
// without its device-wide lock.
#include <array>
#include <cstdint>

#include "allocator/address_map.hpp"
#include "allocator/spin_lock.hpp"

namespace stowage::detail {

class LiveBlocks {
 public:
  // Runs f(map) with the shard of `addr` locked; returns what f returns.
  template <class F>
  auto with(std::uintptr_t addr, F&& f) {
    Shard& s = shard(addr);
    std::lock_guard lock(s.lock);
    return f(s.map);
  }
  Block* find(std::uintptr_t addr) {
    return with(addr, [&](AddressMap& m) { return m.find(addr); });
  }
  void insert(std::uintptr_t addr, Block* b) {
    with(addr, [&](AddressMap& m) { m.insert(addr, b); });
  }
  bool erase(std::uintptr_t addr) {
    return with(addr, [&](AddressMap& m) { return m.erase(addr); });
  }
  std::size_t size() {
    std::size_t n = 0;
    for (Shard& s : shards_) {
      std::lock_guard lock(s.lock);
      n += s.map.size();
    }
    return n;
  }
  bool empty() { return size() == 0; }

 private:
  static constexpr std::size_t kShards = 32;
  struct alignas(64) Shard {
    SpinLock lock;
    AddressMap map{64};
  };
  Shard& shard(std::uintptr_t addr) {
    // Blocks are 512-byte multiples; mix the bits above that so neighbours land apart.
    return shards_[((addr >> 9) * 0x9E3779B97F4A7C15ull) >> 59];
  }
  std::array<Shard, kShards> shards_;
};

}  // namespace stowage::detail
