#pragma once
// Where the host pool's pages come from: mmap, bound to a NUMA node (mbind), populated, pinned
// for the device. Each mapping ("chunk") is pinned once as a whole and unpinned when the whole
// chunk comes back. Both backends (jemalloc hooks, builtin classes) draw from one of these.
// Never throws from map/unmap: jemalloc calls them through C hooks.
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "stowage/device.hpp"

namespace stowage::offload {

struct ExtentCounters {
  std::size_t pinned_bytes = 0, peak_pinned_bytes = 0;
  std::uint64_t num_maps = 0, num_unmaps = 0;
  std::map<int, std::size_t> pinned_per_node;
};

class ExtentSource {
 public:
  // `nodes`: the nodes to bind to, round-robin per chunk (empty: no binding).
  ExtentSource(Device& device, std::vector<int> nodes, std::size_t cap_bytes, bool pin);
  ~ExtentSource();  // unmaps whatever is still mapped
  ExtentSource(const ExtentSource&) = delete;
  ExtentSource& operator=(const ExtentSource&) = delete;

  // A fresh chunk of `bytes` (page multiple) aligned to `alignment`; nullptr when the cap or the
  // system refuses. Contents are zero.
  void* map(std::size_t bytes, std::size_t alignment);
  // Unpins and unmaps [ptr, ptr+bytes) when it is exactly one whole chunk; false otherwise.
  bool unmap_whole(void* ptr, std::size_t bytes);
  // Takes back a piece of a chunk; the chunk is unpinned and unmapped once all of it came back.
  void return_piece(void* ptr, std::size_t bytes);
  // Whether [a, a+na) and [b, b+nb) lie in one chunk.
  bool same_chunk(const void* a, std::size_t na, const void* b, std::size_t nb) const;

  int node_of(const void* ptr) const;       // -1 when unknown or not ours
  bool would_fit(std::size_t bytes) const;  // under the cap
  bool numa_bound() const { return !nodes_.empty(); }
  std::size_t cap_bytes() const { return cap_; }
  ExtentCounters counters() const;
  void reset_peak();

 private:
  struct Chunk {
    std::size_t bytes = 0;
    int node = -1;
    std::size_t returned = 0;  // bytes handed back through return_piece
  };
  using ChunkMap = std::map<std::uintptr_t, Chunk>;
  ChunkMap::const_iterator find_locked(std::uintptr_t addr) const;
  void unmap_locked(ChunkMap::iterator it);

  Device& device_;
  std::vector<int> nodes_;
  std::size_t cap_;
  bool pin_;
  mutable std::mutex mutex_;
  ChunkMap chunks_;
  std::size_t next_node_ = 0;
  std::size_t pending_ = 0;  // bytes being mapped right now (counted against the cap)
  ExtentCounters counters_;
};

// The node the page at `ptr` lives on (get_mempolicy MPOL_F_ADDR), -1 when unknown.
int numa_node_of_page(const void* ptr);
// Nodes that exist on this machine (ascending); empty without NUMA support.
std::vector<int> numa_nodes_present();

}  // namespace stowage::offload
