#include "allocator/block_pool.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <new>

#include "allocator/segment.hpp"
#include "allocator/size_classes.hpp"

namespace stowage::detail {

BlockPool::~BlockPool() {
  for (Block* b : spare_) delete b;
}

Block* BlockPool::new_block() {
  if (spare_.empty()) return new Block();
  Block* b = spare_.back();
  spare_.pop_back();
  return b;
}

void BlockPool::recycle(Block* b) {
  // Fresh fields, keeping the capacity of the vector and string.
  std::vector<Stream> uses = std::move(b->uses);
  std::string tag = std::move(b->tag);
  uses.clear();
  tag.clear();
  std::destroy_at(b);
  ::new (b) Block{.uses = std::move(uses), .tag = std::move(tag)};
  spare_.push_back(b);
}

Block* BlockPool::best_on(Stream stream, std::size_t rounded, std::size_t max_split) const {
  Block key;
  key.stream = stream;
  key.size = rounded;
  auto it = free_.lower_bound(&key);
  if (it == free_.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  // Larger candidates are larger still, so one check decides for the whole stream. A block no
  // larger than the segment a growth for this request would make still serves it (a request just
  // under max_split can round up past it), or each such request would grow a segment of its own.
  if (max_split > 0) {
    if (rounded < max_split && b->size >= max_split && b->size > classic_segment_size(rounded)) return nullptr;
    if (rounded >= max_split && b->size >= rounded + kLargeBuffer) return nullptr;
  }
  return b;
}

Block* BlockPool::find(std::size_t rounded, Stream stream, std::size_t max_split) const {
  Block* own = best_on(stream, rounded, max_split);
  if (own && own->size == rounded) return own;
  Block* any = any_stream_blocks_ > 0 ? best_on(kAnyStream, rounded, max_split) : nullptr;
  if (!own) return any;
  return any && any->size < own->size ? any : own;
}

Block* BlockPool::find_other_stream(std::size_t rounded, Stream stream, std::size_t max_split) const {
  Block* best = nullptr;
  Block key;
  for (auto it = free_.begin(); it != free_.end();) {
    const Stream s = (*it)->stream;
    if (s != stream && s != kAnyStream) {
      Block* b = best_on(s, rounded, max_split);
      if (b && (!best || b->size < best->size)) best = b;
    }
    if (static_cast<std::uintptr_t>(s) == std::numeric_limits<std::uintptr_t>::max()) break;
    key.stream = Stream{static_cast<std::uintptr_t>(s) + 1};  // the next stream's first block
    key.size = 0;
    key.addr = 0;
    it = free_.lower_bound(&key);
  }
  return best;
}

void BlockPool::count_in(const Block* b, bool in) {
  if (b->stream == kAnyStream) {
    if (in) ++any_stream_blocks_;
    else --any_stream_blocks_;
  }
  if (b->segment->expandable || b->prev || b->next) return;
  if (in) unsplit_free_ += b->size;
  else unsplit_free_ -= b->size;
}

void BlockPool::remove(Block* b) {
  auto node = free_.extract(b);
  if (node && spare_nodes_.size() < 64) spare_nodes_.push_back(std::move(node));
  count_in(b, false);
}

void BlockPool::file(Block* b) {
  if (spare_nodes_.empty()) {
    free_.insert(b);
  } else {
    auto node = std::move(spare_nodes_.back());
    spare_nodes_.pop_back();
    node.value() = b;
    free_.insert(std::move(node));
  }
  count_in(b, true);
}

void BlockPool::absorb_next(Block* b) {
  Block* n = b->next;
  b->size += n->size;
  b->next = n->next;
  if (b->next) {
    b->next->prev = b;
  } else if (b->segment->expandable) {
    Segment& seg = *b->segment;
    seg.last_at[(b->end() - seg.base) / seg.granule] = b;
  }
  recycle(n);
}

Block* BlockPool::insert(Block* b) {
  b->use = BlockUse::free;
  b->requested = 0;
  b->tag.clear();
  b->uses.clear();
  if (Block* n = b->next; n && n->is_free() && streams_compatible(n->stream, b->stream)) {
    remove(n);
    b->stream = merged_stream(b->stream, n->stream);
    b->free_tick = std::max(b->free_tick, n->free_tick);
    absorb_next(b);
  }
  if (Block* p = b->prev; p && p->is_free() && streams_compatible(p->stream, b->stream)) {
    remove(p);
    p->stream = merged_stream(p->stream, b->stream);
    p->free_tick = std::max(p->free_tick, b->free_tick);
    absorb_next(p);
    b = p;
  }
  file(b);
  return b;
}

void BlockPool::coalesce_all_as_any() {
  std::vector<Block*> blocks(free_.begin(), free_.end());
  free_.clear();
  unsplit_free_ = 0;
  any_stream_blocks_ = 0;
  std::sort(blocks.begin(), blocks.end(), [](Block* a, Block* b) { return a->addr < b->addr; });
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    Block* b = blocks[i];
    b->stream = kAnyStream;
    // A free next neighbour is the following entry: nothing lies between b and it.
    while (b->next && b->next->is_free()) {
      absorb_next(b);
      ++i;
    }
    free_.insert(b);
    count_in(b, true);
  }
}

Block* BlockPool::split(Block* b, std::size_t rounded, Stream rest_stream) {
  Block* r = new_block();
  r->addr = b->addr + rounded;
  r->size = b->size - rounded;
  r->stream = rest_stream;
  r->pool = b->pool;
  r->segment = b->segment;
  r->free_tick = b->free_tick;
  r->prev = b;
  r->next = b->next;
  if (r->next) {
    r->next->prev = r;
  } else if (b->segment->expandable) {
    Segment& seg = *b->segment;
    seg.last_at[(r->end() - seg.base) / seg.granule] = r;
  }
  b->next = r;
  b->size = rounded;
  return insert(r);
}

}  // namespace stowage::detail
