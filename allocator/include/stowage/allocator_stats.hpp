#pragma once
// Allocator statistics, named as PyTorch users know them from torch.cuda.memory_stats().
#include <cstdint>
#include <string>

namespace stowage {

// One statistic: its current value, its peak since the last reset, and the running totals of
// what was added ("allocated") and taken away ("freed").
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;
  void add(std::int64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void sub(std::int64_t n) {
    current -= n;
    freed += n;
  }
  void reset_peak() { peak = current; }
};

enum class Pool { small = 0, large = 1 };
inline constexpr int kPoolCount = 2;

// A statistic for all pools together and for each pool ("all", "small_pool", "large_pool").
struct StatArray {
  Stat all, small_pool, large_pool;
  Stat& of(Pool p) { return p == Pool::small ? small_pool : large_pool; }
  const Stat& of(Pool p) const { return p == Pool::small ? small_pool : large_pool; }
  void add(Pool p, std::int64_t n) {
    all.add(n);
    of(p).add(n);
  }
  void sub(Pool p, std::int64_t n) {
    all.sub(n);
    of(p).sub(n);
  }
  void reset_peak() {
    all.reset_peak();
    small_pool.reset_peak();
    large_pool.reset_peak();
  }
};

struct AllocatorStats {
  StatArray allocated_bytes;           // bytes in blocks handed to users (rounded sizes)
  StatArray reserved_bytes;            // bytes obtained from the device (segments / mapped granules)
  StatArray active_bytes;              // allocated + freed blocks still pending on other streams
  StatArray inactive_split_bytes;      // free bytes inside split segments (fragmentation)
  StatArray requested_bytes;           // bytes users asked for (before rounding)
  StatArray allocation;                // number of live allocations
  StatArray segment;                   // number of segments
  std::int64_t num_alloc_retries = 0;  // device refused; cache freed and retried
  std::int64_t num_ooms = 0;
  std::int64_t num_device_alloc = 0;  // device allocations or granule maps
  std::int64_t num_device_free = 0;
  std::int64_t num_stream_waits = 0;  // pending blocks handed out after a device-side wait
  std::int64_t num_sync_all_streams = 0;
  std::int64_t num_thread_cache_hits = 0;  // allocations served by a thread's own cache
  std::int64_t thread_cache_bytes = 0;     // bytes in threads' caches now (reserved, not allocated)
  void reset_peaks();
};

// The statistics as flat JSON, keys like "allocated_bytes.all.current" (PyTorch's layout).
std::string to_json(const AllocatorStats& stats);

}  // namespace stowage
