// Snapshots of the caching allocator: its segments, their blocks and the trace ring.
#include <algorithm>
#include <unordered_set>

#include "allocator/caching_allocator_impl.hpp"

namespace stowage {

using detail::Block;
using detail::BlockUse;

namespace {

// Blocks in threads' caches count as allocated in the block's own state; they are free.
void add_block(SegmentInfo& info, const Block* b, const std::unordered_set<const Block*>& cached) {
  BlockInfo bi;
  bi.address = b->addr;
  bi.size = b->size;
  bi.requested_size = b->requested;
  bi.stream = b->stream;
  bi.tag = b->tag;
  const BlockUse use = cached.count(b) ? BlockUse::free : b->use;
  switch (use) {
    case BlockUse::allocated: bi.state = BlockState::active_allocated; break;
    case BlockUse::pending: bi.state = BlockState::active_pending_free; break;
    case BlockUse::free: bi.state = BlockState::inactive; break;
  }
  if (cached.count(b)) {
    bi.requested_size = 0;
    bi.tag.clear();
  }
  if (use == BlockUse::allocated) info.allocated_size += b->size;
  if (use != BlockUse::free) info.active_size += b->size;
  info.blocks.push_back(std::move(bi));
}

}  // namespace

std::vector<SegmentInfo> CachingAllocator::Impl::segment_infos() const {
  std::unordered_set<const Block*> cached;
  for (const auto& c : owner->caches)
    for (const auto& bin : c->bins)
      for (const Block* b = bin.head; b != nullptr; b = b->cache_next) cached.insert(b);
  std::vector<SegmentInfo> out;
  for (const auto& s : classic) {
    SegmentInfo info;
    info.address = s->base;
    info.total_size = s->size;
    info.pool = s->pool;
    info.stream = s->stream;
    for (const Block* b = s->first; b; b = b->next) add_block(info, b, cached);
    out.push_back(std::move(info));
  }
  // An expandable reservation is reported as one segment of its mapped bytes.
  for (const auto& s : expandable) {
    if (!s) continue;
    SegmentInfo info;
    info.address = s->base;
    info.total_size = s->mapped_bytes;
    info.pool = s->pool;
    info.stream = s->stream;
    info.expandable = true;
    for (std::size_t g = 0; g < s->granules(); ++g) {
      for (const Block* b = s->first_at[g]; b; b = b->next) add_block(info, b, cached);
    }
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
  return out;
}

Snapshot CachingAllocator::snapshot() const {
  impl_->check_not_forked("snapshot");
  Impl::Exclusive ex(*impl_);
  Snapshot s;
  s.device = impl_->device.ordinal();
  s.device_name = impl_->device.name();
  s.capacity = impl_->device.capacity();
  s.stats = impl_->st;
  s.stats.thread_cache_bytes = static_cast<std::int64_t>(impl_->cached_bytes());
  s.segments = impl_->segment_infos();
  s.trace = impl_->trace.ordered();
  return s;
}

}  // namespace stowage
