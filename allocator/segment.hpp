#pragma once
// Segments: the memory the allocator obtains from the device. A classic segment is one
// device.allocate(); an expandable segment is one address reservation per pool, backed granule
// by granule by physical chunks that are mapped on growth and unmapped when wholly free.
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "allocator/block.hpp"
#include "stowage/device.hpp"

namespace stowage::detail {

struct Segment {
  std::uintptr_t base = 0;
  std::size_t size = 0;  // classic: the allocation; expandable: the reservation
  Pool pool = Pool::large;
  Stream stream{};  // the stream whose request created it
  bool expandable = false;
  Block* first = nullptr;  // classic: the lowest block

  // Expandable only, indexed by granule number from base.
  std::size_t granule = 0;
  std::size_t mapped_bytes = 0;
  std::map<std::size_t, std::size_t> gaps;  // unmapped runs of granules: begin -> end
  std::vector<PhysicalHandle> handles;      // PhysicalHandle{0}: not mapped
  std::vector<Block*> first_at;             // block starting a mapped run at granule g
  std::vector<Block*> last_at;              // block ending a mapped run at granule g (its end)

  std::size_t granules() const { return handles.size(); }
  bool mapped(std::size_t g) const { return handles[g] != PhysicalHandle{0}; }
  std::uintptr_t granule_addr(std::size_t g) const { return base + g * granule; }
};

// A run of unmapped granules [begin, end) inside an expandable segment and the place chosen in
// it to map `count` granules starting at `at`.
struct Placement {
  std::size_t at = 0;
  std::size_t count = 0;
};

// Where to map granules so a free block of at least `rounded` bytes usable on `stream` appears,
// extending free neighbours when they are compatible; mapping the fewest granules, lowest address
// first. Returns false when the reservation has no room.
bool plan_expansion(const Segment& seg, std::size_t rounded, Stream stream, Placement& out);

// Maps granules [at, at+count) of `seg` with fresh physical chunks (rolling back on failure).
void map_granules(Device& device, Segment& seg, std::size_t at, std::size_t count);
// Unmaps granules [at, at+count) and destroys their chunks.
void unmap_granules(Device& device, Segment& seg, std::size_t at, std::size_t count);

}  // namespace stowage::detail
