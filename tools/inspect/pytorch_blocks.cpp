#include "tools/inspect/pytorch_blocks.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <map>
#include <string>
#include <unordered_map>

namespace stowage::inspect {

namespace {

constexpr std::uint64_t kMinBlock = 512, kSmallSize = std::uint64_t{1} << 20;

// The free and used blocks of the segments the trace created, by address.
class BlockReplay {
 public:
  explicit BlockReplay(const PyTorchBlockRules& rules) : rules_(rules) {}

  void map(std::uintptr_t address, std::uint64_t size) {
    if (!rules_.expandable) blocks_[address] = {size, address, true};
  }
  void unmap(std::uintptr_t address, std::uint64_t size) {
    blocks_.erase(blocks_.lower_bound(address), blocks_.lower_bound(address + size));
  }
  // The block an allocation of `rounded` bytes at `address` takes; `rounded` where unknown.
  std::uint64_t alloc(std::uintptr_t address, std::uint64_t rounded) {
    const auto it = blocks_.find(address);
    if (it == blocks_.end() || !it->second.free || it->second.size < rounded) return rounded;
    Block& b = it->second;
    b.free = false;
    const std::uint64_t rest = b.size - rounded;
    if (rounded <= kSmallSize ? rest >= kMinBlock : rounded < rules_.max_split_size && rest > kSmallSize) {
      b.size = rounded;
      blocks_[address + rounded] = {rest, b.segment, true};
    }
    return b.size;
  }
  void free(std::uintptr_t address) {
    auto it = blocks_.find(address);
    if (it == blocks_.end() || it->second.free) return;
    it->second.free = true;
    if (const auto next = std::next(it); next != blocks_.end() && joins(it, next)) {
      it->second.size += next->second.size;
      blocks_.erase(next);
    }
    if (it != blocks_.begin())
      if (const auto prev = std::prev(it); joins(prev, it)) {
        prev->second.size += it->second.size;
        blocks_.erase(it);
      }
  }

 private:
  struct Block {
    std::uint64_t size;
    std::uintptr_t segment;
    bool free;
  };
  using It = std::map<std::uintptr_t, Block>::iterator;
  static bool joins(It a, It b) {
    return a->second.free && b->second.free && a->second.segment == b->second.segment &&
           a->first + a->second.size == b->first;
  }
  const PyTorchBlockRules& rules_;
  std::map<std::uintptr_t, Block> blocks_;
};

}  // namespace

PyTorchBlockRules pytorch_block_rules(const nlohmann::json& snapshot) {
  PyTorchBlockRules r;
  const auto s = snapshot.is_object() ? snapshot.find("allocator_settings") : snapshot.end();
  if (snapshot.is_object() && s != snapshot.end() && s->is_object()) {
    if (const auto m = s->find("max_split_size"); m != s->end() && m->is_number_integer() && m->get<std::int64_t>() > 0)
      r.max_split_size = m->get<std::uint64_t>();
    if (const auto e = s->find("expandable_segments"); e != s->end() && e->is_boolean()) r.expandable = e->get<bool>();
    // {"1": d, "2": d, ..., "32768": d}: the interval from that many MiB to twice as many.
    if (const auto d = s->find("roundup_power2_divisions"); d != s->end() && d->is_object())
      for (const auto& [mib, n] : d->items()) {
        std::uint64_t v = 0;
        const auto [end, error] = std::from_chars(mib.data(), mib.data() + mib.size(), v);
        if (error == std::errc() && end == mib.data() + mib.size() && std::has_single_bit(v) && v <= 32768 &&
            n.is_number_integer() && n.get<std::int64_t>() >= 0)
          r.divisions[std::size_t(std::countr_zero(v))] = n.get<std::uint64_t>();
      }
  }
  if (const auto segments = snapshot.is_object() ? snapshot.find("segments") : snapshot.end();
      snapshot.is_object() && segments != snapshot.end() && segments->is_array())
    for (const auto& seg : *segments)
      if (seg.is_object() && seg.value("is_expandable", nlohmann::json(false)) == true) r.expandable = true;
  return r;
}

std::uint64_t round_size(std::uint64_t size, const PyTorchBlockRules& rules) {
  if (size == 0) return 0;
  if (size < kMinBlock) return kMinBlock;
  const int log = std::bit_width(size) - 1;  // CUDAAllocatorConfig::roundup_power2_divisions
  const std::uint64_t divisions = rules.divisions[std::size_t(std::clamp(log - 20, 0, 15))];
  if (divisions > 1 && divisions <= size / kMinBlock && size > kMinBlock * divisions) {
    if (std::has_single_bit(size)) return size;  // roundup_power2_next_division
    const std::uint64_t step = std::bit_floor(size) >> (std::bit_width(divisions) - 1);
    if (step == 0) return std::bit_floor(size) << 1;
    const std::uint64_t floor = size & ~(step - 1);
    return floor == size ? size : floor + step;
  }
  return (size + kMinBlock - 1) / kMinBlock * kMinBlock;
}

void to_block_sizes(Snapshot& s, const std::vector<std::uint64_t>& requested, const PyTorchBlockRules& rules) {
  std::unordered_map<std::uintptr_t, std::uint64_t> active;  // block address → size, live blocks
  for (const auto& seg : s.segments)
    for (const auto& b : seg.blocks)
      if (b.state != BlockState::inactive) active[b.address] = b.size;
  BlockReplay replay(rules);
  std::unordered_map<std::uintptr_t, std::vector<std::size_t>> open;  // its alloc and free_requested
  for (std::size_t i = 0; i < s.trace.size(); ++i) {
    TraceEntry& t = s.trace[i];
    if (t.action == TraceAction::segment_map) replay.map(t.address, t.size);
    if (t.action == TraceAction::segment_unmap) replay.unmap(t.address, t.size);
    if (t.action == TraceAction::alloc) {
      t.size = replay.alloc(t.address, round_size(requested[i], rules));
      open[t.address] = {i};
    } else if (t.action == TraceAction::free_requested || t.action == TraceAction::free_completed) {
      auto it = open.find(t.address);
      t.size = it != open.end() ? s.trace[it->second.front()].size : round_size(requested[i], rules);
      if (t.action == TraceAction::free_completed) {
        replay.free(t.address);
        if (it != open.end()) open.erase(it);
      } else if (it != open.end()) {
        it->second.push_back(i);
      } else {
        open[t.address] = {i};
      }
    }
  }
  for (const auto& [address, entries] : open)
    if (const auto b = active.find(address); b != active.end())
      for (std::size_t i : entries) s.trace[i].size = b->second;
}

}  // namespace stowage::inspect
