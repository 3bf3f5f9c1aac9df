#include "allocator/segment.hpp"

#include <algorithm>
#include <limits>

namespace stowage::detail {
namespace {

void unmap_uncounted(Device& device, Segment& seg, std::size_t at, std::size_t count) {
  device.unmap(reinterpret_cast<void*>(seg.granule_addr(at)), count * seg.granule);
  for (std::size_t i = at; i < at + count; ++i) {
    device.destroy_physical(seg.handles[i]);
    seg.handles[i] = PhysicalHandle{0};
  }
}

// Bytes of a free neighbour the new mapping can merge with, or 0.
std::size_t usable(const Block* b, Stream stream) {
  return b && b->is_free() && streams_compatible(b->stream, stream) ? b->size : 0;
}

}  // namespace

bool plan_expansion(const Segment& seg, std::size_t rounded, Stream stream, Placement& out) {
  const std::size_t n = seg.granules(), g = seg.granule;
  std::size_t best = std::numeric_limits<std::size_t>::max();
  auto consider = [&](std::size_t at, std::size_t count) {
    if (count < best) {
      best = count;
      out = {at, count};
    }
  };
  for (const auto& [begin, end] : seg.gaps) {
    const std::size_t gap = end - begin;
    const std::size_t left = begin > 0 ? usable(seg.last_at[begin], stream) : 0;
    const std::size_t right = end < n ? usable(seg.first_at[end], stream) : 0;
    auto need = [&](std::size_t have) { return have >= rounded ? 1 : (rounded - have + g - 1) / g; };
    if (std::size_t k = need(left); k <= gap) consider(begin, k);     // grow the left block
    if (std::size_t k = need(right); k <= gap) consider(end - k, k);  // grow the right one down
    if (left + gap * g + right >= rounded) consider(begin, gap);      // bridge both
  }
  return best != std::numeric_limits<std::size_t>::max();
}

namespace {

// A mapping the driver refused once is tried once more before the growth is undone: a refusal can
// be passing, and with several granules per growth one refused call should not undo them all (nor,
// with STOWAGE_FAULTS=map=2, fail every growth). A second refusal stands. A refused physical
// chunk (OutOfMemory) is left to the allocator's own retry, after it empties its cache.
template <class F>
void twice(F&& f) {
  try {
    f();
    return;
  } catch (const DeviceError&) {
  }
  f();
}

}  // namespace

void map_granules(Device& device, Segment& seg, std::size_t at, std::size_t count) {
  std::size_t done = 0;
  try {
    for (; done < count; ++done) {
      PhysicalHandle h = device.create_physical(seg.granule);
      try {
        twice([&] { device.map(reinterpret_cast<void*>(seg.granule_addr(at + done)), seg.granule, h); });
      } catch (...) {
        device.destroy_physical(h);
        throw;
      }
      seg.handles[at + done] = h;
    }
    twice([&] { device.set_access(reinterpret_cast<void*>(seg.granule_addr(at)), count * seg.granule); });
  } catch (...) {
    if (done > 0) unmap_uncounted(device, seg, at, done);
    throw;
  }
  seg.mapped_bytes += count * seg.granule;
  // [at, at+count) lies inside one gap: cut it out.
  auto it = std::prev(seg.gaps.upper_bound(at));
  const std::size_t begin = it->first, end = it->second;
  seg.gaps.erase(it);
  if (begin < at) seg.gaps[begin] = at;
  if (at + count < end) seg.gaps[at + count] = end;
}

void unmap_granules(Device& device, Segment& seg, std::size_t at, std::size_t count) {
  unmap_uncounted(device, seg, at, count);
  seg.mapped_bytes -= count * seg.granule;
  // A new gap, merged with the gaps it touches.
  std::size_t begin = at, end = at + count;
  auto next = seg.gaps.find(end);
  if (next != seg.gaps.end()) {
    end = next->second;
    seg.gaps.erase(next);
  }
  auto it = seg.gaps.lower_bound(begin);
  if (it != seg.gaps.begin() && std::prev(it)->second == begin) {
    --it;
    begin = it->first;
    seg.gaps.erase(it);
  }
  seg.gaps[begin] = end;
}

}  // namespace stowage::detail
