#include "tools/inspect/snapshot_consistency.hpp"

#include <fmt/format.h>

#include <limits>

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
    // In 128 bits: sizes and ends read from a file may pass 2^64.
    unsigned __int128 sum = 0;
    unsigned __int128 next = seg.address;  // where the block before ends (the segment's start at first)
    bool placed = true;                    // one misplaced block is named, not every one after it
    for (std::size_t k = 0; k < seg.blocks.size(); ++k) {
      const BlockInfo& b = seg.blocks[k];
      const unsigned __int128 end = static_cast<unsigned __int128>(b.address) + b.size;
      const auto starts = [&] { return fmt::format("segments[{}].blocks[{}] starts at {:#x}", i, k, b.address); };
      if (placed && !seg.expandable && b.address != next) {
        out.push_back(k == 0 ? fmt::format("{}, not at its segment's address {:#x}", starts(), seg.address)
                             : fmt::format("{}, not where the one before ends ({:#x})", starts(), next));
        placed = false;
      } else if (placed && seg.expandable && b.address < next) {
        // Expandable: unmapped holes between runs are not listed, so a block may start past the
        // one before, never inside it or below the reservation.
        out.push_back(k == 0 ? fmt::format("{}, below its expandable segment's address {:#x}", starts(), seg.address)
                             : fmt::format("{}, inside the one before (which ends at {:#x})", starts(), next));
        placed = false;
      } else if (placed && end > std::numeric_limits<std::uintptr_t>::max()) {
        out.push_back(fmt::format("segments[{}].blocks[{}] at {:#x} with {} bytes ends past the address space", i, k,
                                  b.address, b.size));
        placed = false;
      }
      // A free block's requested size is left over from an earlier allocation (PyTorch's
      // snapshot reports a split remainder's stale one): only blocks in use are held to it.
      if (b.state != BlockState::inactive && b.requested_size > b.size)
        out.push_back(fmt::format("segments[{}].blocks[{}]: requested {} bytes, more than its size {}", i, k,
                                  b.requested_size, b.size));
      next = end;
      sum += b.size;
    }
    if (sum != seg.total_size)
      out.push_back(fmt::format("segments[{}]: its {} blocks add up to {} bytes, not its total_size {}", i,
                                seg.blocks.size(), sum, seg.total_size));
  }
  return out;
}

}  // namespace stowage::inspect
