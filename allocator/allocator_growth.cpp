// How the caching allocator obtains memory from the device and gives it back: classic segments,
// expandable-segment granules, empty_cache, garbage collection and out-of-memory reports.
#include <algorithm>
#include <limits>

#include "allocator/caching_allocator_impl.hpp"
#include "allocator/size_classes.hpp"
#include "common/log.hpp"
#include "fmt/format.h"
#include "stowage/byte_size.hpp"

namespace stowage {

using detail::Block;
using detail::Segment;

Block* CachingAllocator::Impl::grow(Pool p, std::size_t rounded, Stream stream) {
  if (mode == SegmentMode::classic) return grow_classic(p, rounded, stream);
  grow_expandable(p, rounded, stream);  // the new granules merge with free neighbours in the pool
  Block* b = pool(p).find(rounded, stream, max_split());
  // hand_out syncs the split statistic once the block is split: syncing before would count the
  // new granules as inactive split bytes for an instant, a peak no caller could see.
  if (b == nullptr) sync_split_stat(p);
  return b;
}

Block* CachingAllocator::Impl::grow_classic(Pool p, std::size_t rounded, Stream stream) {
  const std::size_t size = detail::classic_segment_size(rounded);
  const auto reserved = static_cast<std::size_t>(st.reserved_bytes.all.current);
  if (reserved + size > limit()) {
    throw OutOfMemory(
        fmt::format("a new {} segment would pass the limit of {}", format_bytes(size), format_bytes(limit())));
  }
  void* ptr = device.allocate(size);
  auto seg = std::make_unique<Segment>();
  seg->base = reinterpret_cast<std::uintptr_t>(ptr);
  seg->size = size;
  seg->pool = p;
  seg->stream = stream;
  Block* b = pool(p).new_block();
  b->addr = seg->base;
  b->size = size;
  b->pool = p;
  b->segment = seg.get();
  b->stream = detail::kAnyStream;
  seg->first = b;
  classic.push_back(std::move(seg));
  ++st.num_device_alloc;
  st.reserved_bytes.add(p, static_cast<std::int64_t>(size));
  st.segment.add(p, 1);
  if (trace.enabled()) trace.push(TraceAction::segment_map, b->addr, size, stream, ScopedTag::current());
  pool(p).insert(b);
  sync_split_stat(p);
  return b;
}

void CachingAllocator::Impl::grow_expandable(Pool p, std::size_t rounded, Stream stream) {
  auto& seg = expandable[static_cast<int>(p)];
  const std::size_t g = device.properties().granularity;
  if (!seg) {
    const std::size_t want = opts.expandable_reserve > 0 ? opts.expandable_reserve : 2 * device.capacity();
    // Address space may be limited (ulimit -v): a refused reservation is retried at half the
    // size, down to what this request needs, before the refusal stands.
    const std::size_t need = detail::round_up(std::max(rounded, g), g);
    std::size_t bytes = detail::round_up(std::max(want, g), g);
    void* base = nullptr;
    while (base == nullptr) {
      try {
        base = device.reserve(bytes);
      } catch (const OutOfMemory&) {
        if (bytes <= need) throw;
        bytes = std::max(need, detail::round_up(bytes / 2, g));
      } catch (const DeviceError&) {
        if (bytes <= need) throw;
        bytes = std::max(need, detail::round_up(bytes / 2, g));
      }
    }
    auto s = std::make_unique<Segment>();
    s->base = reinterpret_cast<std::uintptr_t>(base);
    s->size = bytes;
    s->pool = p;
    s->stream = stream;
    s->expandable = true;
    s->granule = g;
    s->handles.assign(bytes / g, PhysicalHandle{0});
    s->first_at.assign(bytes / g, nullptr);
    s->last_at.assign(bytes / g + 1, nullptr);
    s->gaps[0] = bytes / g;
    seg = std::move(s);
    st.segment.add(p, 1);
  }
  detail::Placement pl;
  if (!detail::plan_expansion(*seg, rounded, stream, pl)) {
    throw OutOfMemory(fmt::format("the {} address reservation of the {} pool is full", format_bytes(seg->size),
                                  p == Pool::small ? "small" : "large"));
  }
  const std::size_t bytes = pl.count * g;
  const auto reserved = static_cast<std::size_t>(st.reserved_bytes.all.current);
  if (reserved + bytes > limit()) {
    throw OutOfMemory(
        fmt::format("mapping {} more would pass the limit of {}", format_bytes(bytes), format_bytes(limit())));
  }
  const std::size_t n = seg->granules(), a = pl.at, k = pl.count;
  Block* prev = a > 0 && seg->mapped(a - 1) ? seg->last_at[a] : nullptr;
  Block* next = a + k < n && seg->mapped(a + k) ? seg->first_at[a + k] : nullptr;
  detail::map_granules(device, *seg, a, k);
  Block* b = pool(p).new_block();
  b->addr = seg->granule_addr(a);
  b->size = bytes;
  b->pool = p;
  b->segment = seg.get();
  b->stream = detail::kAnyStream;
  b->prev = prev;
  b->next = next;
  if (prev) {
    prev->next = b;
    seg->last_at[a] = nullptr;
  } else {
    seg->first_at[a] = b;
  }
  if (next) {
    next->prev = b;
    seg->first_at[a + k] = nullptr;
  } else {
    seg->last_at[a + k] = b;
  }
  st.num_device_alloc += static_cast<std::int64_t>(k);
  st.reserved_bytes.add(p, static_cast<std::int64_t>(bytes));
  if (trace.enabled()) trace.push(TraceAction::segment_map, b->addr, bytes, stream, ScopedTag::current());
  pool(p).insert(b);
}

std::size_t CachingAllocator::Impl::release_block(Block* b) {
  Segment& seg = *b->segment;
  const Pool p = b->pool;
  detail::BlockPool& bp = pool(p);
  if (!seg.expandable) {
    if (b->prev || b->next) return 0;
    bp.remove(b);
    device.deallocate(reinterpret_cast<void*>(seg.base));
    const std::size_t size = seg.size;
    if (trace.enabled()) trace.push(TraceAction::segment_unmap, seg.base, size, b->stream, ScopedTag::current());
    bp.recycle(b);
    std::erase_if(classic, [&](const auto& s) { return s.get() == &seg; });
    ++st.num_device_free;
    st.reserved_bytes.sub(p, static_cast<std::int64_t>(size));
    st.segment.sub(p, 1);
    return size;
  }
  // Expandable: unmap the whole granules inside b; what is left at either end stays free.
  const std::size_t g = seg.granule;
  const std::size_t g0 = (detail::round_up(b->addr, g) - seg.base) / g;
  const std::size_t g1 = (detail::round_down(b->end(), g) - seg.base) / g;
  if (g0 >= g1) return 0;
  bp.remove(b);
  detail::unmap_granules(device, seg, g0, g1 - g0);
  Block* prev = b->prev;
  Block* next = b->next;
  const std::uintptr_t start = b->addr, end = b->end();
  if (!prev) seg.first_at[(start - seg.base) / g] = nullptr;
  if (!next) seg.last_at[(end - seg.base) / g] = nullptr;
  Block* left = nullptr;
  if (start < seg.granule_addr(g0)) {  // b keeps the head
    left = b;
    left->size = seg.granule_addr(g0) - start;
    left->next = nullptr;
    seg.last_at[g0] = left;
  } else if (prev) {
    prev->next = nullptr;
    seg.last_at[g0] = prev;
  }
  if (seg.granule_addr(g1) < end) {  // a new block keeps the tail
    Block* right = bp.new_block();
    right->addr = seg.granule_addr(g1);
    right->size = end - right->addr;
    right->pool = p;
    right->segment = &seg;
    right->stream = b->stream;
    right->free_tick = b->free_tick;
    right->next = next;
    next->prev = right;  // an unaligned end means b had a next neighbour
    seg.first_at[g1] = right;
    bp.insert(right);
  } else if (next) {
    next->prev = nullptr;
    seg.first_at[g1] = next;
  }
  if (left) {
    bp.insert(left);
  } else {
    bp.recycle(b);
  }
  const std::size_t bytes = (g1 - g0) * g;
  if (trace.enabled())
    trace.push(TraceAction::segment_unmap, seg.granule_addr(g0), bytes, detail::kAnyStream, ScopedTag::current());
  st.num_device_free += static_cast<std::int64_t>(g1 - g0);
  st.reserved_bytes.sub(p, static_cast<std::int64_t>(bytes));
  return bytes;
}

std::size_t CachingAllocator::Impl::release_cached(std::size_t want, bool oldest_first) {
  drain_caches();
  device.synchronize();
  ++st.num_sync_all_streams;
  for (Pending& pe : pending) {
    spare_events.insert(spare_events.end(), pe.events.begin(), pe.events.end());
    complete_free(pe.block);
  }
  pending.clear();
  std::vector<Block*> candidates;
  for (auto& bp : pools) {
    bp.coalesce_all_as_any();
    candidates.insert(candidates.end(), bp.free_blocks().begin(), bp.free_blocks().end());
  }
  if (oldest_first) {
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const Block* a, const Block* b) { return a->free_tick < b->free_tick; });
  }
  std::size_t released = 0;
  for (Block* b : candidates) {
    if (released >= want) break;
    released += release_block(b);
  }
  for (Pool p : {Pool::small, Pool::large}) sync_split_stat(p);
  return released;
}

void CachingAllocator::Impl::maybe_collect_garbage(Pool p, std::size_t rounded) {
  // Only under a cap, as PyTorch collects only under a memory fraction below 1.
  if (opts.gc_threshold <= 0.0 || cap == 0) return;
  const std::size_t growth = mode == SegmentMode::expandable
                                 ? detail::round_up(rounded, device.properties().granularity)
                                 : detail::classic_segment_size(rounded);
  const auto threshold = static_cast<std::size_t>(opts.gc_threshold * static_cast<double>(limit()));
  const auto reserved = static_cast<std::size_t>(st.reserved_bytes.all.current);
  const auto active = static_cast<std::size_t>(st.active_bytes.all.current);
  if (reserved + growth <= threshold || reserved == active) return;
  release_cached(reserved + growth - threshold, true);
}

std::size_t CachingAllocator::Impl::largest_free_block() const {
  std::size_t largest = 0;
  for (const auto& bp : pools) {
    for (const Block* b : bp.free_blocks()) largest = std::max(largest, b->size);
  }
  return largest;
}

void CachingAllocator::Impl::throw_oom(std::size_t bytes, std::size_t rounded, const std::string& why) {
  ++st.num_ooms;
  if (trace.enabled()) trace.push(TraceAction::oom, 0, rounded, Stream{}, ScopedTag::current());
  const auto allocated = static_cast<std::size_t>(st.allocated_bytes.all.current);
  const auto reserved = static_cast<std::size_t>(st.reserved_bytes.all.current);
  std::string advice;
  if (mode == SegmentMode::classic) {
    advice += device.properties().virtual_memory ? "set expandable_segments:True to avoid fragmentation; "
                                                 : "expandable segments are not available on this device; ";
  }
  advice += cap > 0 ? "raise or remove the memory cap (memory_cap_mb); "
                    : "set a memory cap (memory_cap_mb) to share the device predictably; ";
  advice += "call empty_cache() in other allocators on this device, or use smaller batches";
  throw OutOfMemory(
      fmt::format("stowage: out of memory on device {} ({}): tried to allocate {} ({} bytes, {} rounded); "
                  "capacity {}, memory cap {}, device free {}; {} allocated, {} reserved but unallocated, "
                  "largest free block {}; segments {}; cause: {}. Try: {}",
                  device.ordinal(), device.name(), format_bytes(bytes), bytes, rounded, format_bytes(device.capacity()),
                  cap > 0 ? format_bytes(cap) : std::string("none"), format_bytes(device.free_memory()),
                  format_bytes(allocated), format_bytes(reserved - allocated), format_bytes(largest_free_block()),
                  mode == SegmentMode::expandable ? "expandable" : "classic", why, advice));
}

std::string CachingAllocator::Impl::describe_foreign(std::uintptr_t addr) const {
  auto in = [&](const Segment& s) { return addr >= s.base && addr < s.base + s.size; };
  const Segment* seg = nullptr;
  for (const auto& s : classic)
    if (in(*s)) seg = s.get();
  for (const auto& s : expandable)
    if (s && in(*s)) seg = s.get();
  if (!seg) return fmt::format("stowage: free of {:#x}, which this allocator never gave out", addr);
  if (seg->expandable && !seg->mapped((addr - seg->base) / seg->granule))
    return fmt::format("stowage: double free of {:#x} (the memory was freed and given back to the device)", addr);
  for (const auto& pe : pending) {
    if (pe.block->addr == addr)
      return fmt::format("stowage: double free of {:#x} (already freed, pending on other streams)", addr);
  }
  for (const auto& c : owner->caches)
    for (const auto& bin : c->bins)
      for (const Block* b = bin.head; b != nullptr; b = b->cache_next)
        if (b->addr == addr)
          return fmt::format("stowage: double free of {:#x} (already freed, kept in a thread's cache)", addr);
  for (const auto& bp : pools) {
    for (const Block* b : bp.free_blocks()) {
      if (b->addr <= addr && addr < b->end())
        return fmt::format("stowage: double free of {:#x} (the memory is free)", addr);
    }
  }
  return fmt::format("stowage: free of {:#x}, which points inside a block rather than at its start", addr);
}

void CachingAllocator::Impl::release_everything() noexcept {
  const bool ours = !forked_since(generation);  // else the device would refuse every call
  if (ours) {
    try {
      device.synchronize();
    } catch (const std::exception& e) {
      log().warn("synchronize before releasing the cache failed: {}", e.what());
    }
    if (!live.empty()) log().warn("allocator destroyed with {} live blocks (leaked)", live.size());
  }
  auto drop_blocks = [&](Block* b) {
    while (b) {
      Block* n = b->next;
      delete b;
      b = n;
    }
  };
  for (auto& s : classic) {
    drop_blocks(s->first);
    if (!ours) continue;
    try {
      device.deallocate(reinterpret_cast<void*>(s->base));
    } catch (const std::exception& e) {
      log().warn("giving back a segment failed: {}", e.what());
    }
  }
  classic.clear();
  for (auto& s : expandable) {
    if (!s) continue;
    for (std::size_t g = 0; g < s->granules(); ++g) drop_blocks(s->first_at[g]);
    if (!ours) {
      s.reset();
      continue;
    }
    try {
      for (std::size_t g = 0; g < s->granules();) {
        if (!s->mapped(g)) {
          ++g;
          continue;
        }
        std::size_t e = g;
        while (e < s->granules() && s->mapped(e)) ++e;
        detail::unmap_granules(device, *s, g, e - g);
        g = e;
      }
      device.unreserve(reinterpret_cast<void*>(s->base), s->size);
    } catch (const std::exception& e) {
      log().warn("giving back an expandable segment failed: {}", e.what());
    }
    s.reset();
  }
  if (!ours) {
    spare_events.clear();
    pending.clear();
    return;
  }
  for (Event e : spare_events) {
    try {
      device.destroy_event(e);
    } catch (...) {
    }
  }
  for (auto& pe : pending)
    for (Event e : pe.events) try {
        device.destroy_event(e);
      } catch (...) {
      }
  spare_events.clear();
  pending.clear();
}

}  // namespace stowage
