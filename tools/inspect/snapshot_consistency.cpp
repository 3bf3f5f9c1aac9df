#include "tools/inspect/snapshot_consistency.hpp"

#include <fmt/format.h>

namespace stowage::inspect {

std::vector<std::string> inconsistencies(const Snapshot& s) {
  std::vector<std::string> out;
  const AllocatorStats& st = s.stats;
  const std::pair<const char*, const StatArray*> arrays[] = {{"allocated_bytes", &st.allocated_bytes},
                                                             {"reserved_bytes", &st.reserved_bytes},
                                                             {"active_bytes", &st.active_bytes},
                                                             {"inactive_split_bytes", &st.inactive_split_bytes},
                                                             {"requested_bytes", &st.requested_bytes},
                                                             {"allocation", &st.allocation},
                                                             {"segment", &st.segment}};
  for (const auto& [name, array] : arrays)
    for (const auto& [pool, stat] : {std::pair<const char*, const Stat*>{"all", &array->all},
                                     {"small_pool", &array->small_pool},
                                     {"large_pool", &array->large_pool}}) {
      const std::string where = fmt::format("stats.{}.{}", name, pool);
      if (stat->current < 0 || stat->peak < 0 || stat->allocated < 0 || stat->freed < 0)
        out.push_back(fmt::format("{} has a negative value (current {}, peak {}, allocated {}, freed {})", where,
                                  stat->current, stat->peak, stat->allocated, stat->freed));
      else if (stat->peak < stat->current)
        out.push_back(fmt::format("{}: peak {} is below current {}", where, stat->peak, stat->current));
    }
  if (st.allocated_bytes.all.current > st.reserved_bytes.all.current)
    out.push_back(fmt::format("stats: allocated_bytes {} exceed reserved_bytes {}", st.allocated_bytes.all.current,
                              st.reserved_bytes.all.current));
  for (std::size_t i = 0; i < s.segments.size(); ++i) {
    const SegmentInfo& seg = s.segments[i];
    std::uintptr_t next = seg.address;
    std::size_t sum = 0;
    for (std::size_t k = 0; k < seg.blocks.size(); ++k) {
      const BlockInfo& b = seg.blocks[k];
      if (b.address != next) {
        out.push_back(fmt::format("segments[{}].blocks[{}] starts at {:#x}, not where the one before ends ({:#x})", i,
                                  k, b.address, next));
        break;
      }
      if (b.requested_size > b.size)
        out.push_back(fmt::format("segments[{}].blocks[{}]: requested {} bytes, more than its size {}", i, k,
                                  b.requested_size, b.size));
      next += b.size;
      sum += b.size;
    }
    if (sum != seg.total_size)
      out.push_back(
          fmt::format("segments[{}]: its blocks add up to {} bytes, not its total_size {}", i, sum, seg.total_size));
  }
  return out;
}

}  // namespace stowage::inspect
