// AllocatorStats: peak reset and the flat JSON layout of torch.cuda.memory_stats().
#include "stowage/allocator_stats.hpp"
#include "nlohmann/json.hpp"

namespace stowage {

void AllocatorStats::reset_peaks() {
  allocated_bytes.reset_peak();
  reserved_bytes.reset_peak();
  active_bytes.reset_peak();
  inactive_split_bytes.reset_peak();
  requested_bytes.reset_peak();
  allocation.reset_peak();
  segment.reset_peak();
}

std::string to_json(const AllocatorStats& s) {
  nlohmann::ordered_json j;
  auto put = [&](const char* name, const StatArray& a) {
    for (auto [pool, stat] : {std::pair<const char*, const Stat*>{"all", &a.all},
                              {"small_pool", &a.small_pool},
                              {"large_pool", &a.large_pool}}) {
      const std::string prefix = std::string(name) + "." + pool + ".";
      j[prefix + "current"] = stat->current;
      j[prefix + "peak"] = stat->peak;
      j[prefix + "allocated"] = stat->allocated;
      j[prefix + "freed"] = stat->freed;
    }
  };
  put("allocated_bytes", s.allocated_bytes);
  put("reserved_bytes", s.reserved_bytes);
  put("active_bytes", s.active_bytes);
  put("inactive_split_bytes", s.inactive_split_bytes);
  put("requested_bytes", s.requested_bytes);
  put("allocation", s.allocation);
  put("segment", s.segment);
  j["num_alloc_retries"] = s.num_alloc_retries;
  j["num_ooms"] = s.num_ooms;
  j["num_device_alloc"] = s.num_device_alloc;
  j["num_device_free"] = s.num_device_free;
  j["num_stream_waits"] = s.num_stream_waits;
  j["num_sync_all_streams"] = s.num_sync_all_streams;
  j["num_thread_cache_hits"] = s.num_thread_cache_hits;
  j["thread_cache_bytes"] = s.thread_cache_bytes;
  return j.dump();
}

}  // namespace stowage
