#pragma once
// The pinned, NUMA-aware host pool: host memory for offload (swap, optimizer states). Pages are
// mapped with mmap, bound to the NUMA node(s) nearest the device and pinned for it once; buffers
// are then reused, so no pinning happens on the hot path. How the two backends (jemalloc arena,
// built-in size classes) are chosen is described in docs/host_pool.md.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stowage/dependents.hpp"
#include "stowage/device.hpp"

namespace stowage {

enum class HostPoolBackend {
  automatic,  // jemalloc when the process has it loaded, else builtin
  jemalloc,   // a dedicated jemalloc arena; Unsupported when jemalloc is not in the process
  builtin,    // stowage's own size-class allocator over the same extent source
};
const char* to_string(HostPoolBackend backend);

struct HostPoolOptions {
  // Most bytes the pool maps and pins (0 = no cap). Beyond it allocate() throws OutOfMemory.
  std::size_t cap_bytes = 0;
  // Nodes to bind pages to; empty = the device's properties().numa_nodes; when neither names a
  // node, pages are not bound and are accounted to the node they landed on.
  std::vector<int> numa_nodes;
  HostPoolBackend backend = HostPoolBackend::automatic;
  // Register pages with the device (pin_host). Off only for measurements.
  bool pin = true;
};

struct HostPoolNodeStats {
  int node = -1;                 // -1: the node is unknown (no NUMA support)
  std::size_t pinned_bytes = 0;  // mapped and pinned on this node
  std::size_t in_use_bytes = 0;  // handed out from this node
};

struct HostPoolStats {
  std::string backend;           // "jemalloc" or "builtin"
  std::size_t cap_bytes = 0;     // 0 = none
  std::size_t pinned_bytes = 0;  // mapped, bound and pinned: what the pool holds
  std::size_t peak_pinned_bytes = 0;
  std::size_t in_use_bytes = 0;  // handed out, in the backend's rounded sizes
  std::size_t peak_in_use_bytes = 0;
  std::size_t requested_bytes = 0;  // handed out, as asked
  std::size_t live_buffers = 0;
  std::uint64_t num_allocs = 0, num_frees = 0;
  std::uint64_t num_maps = 0, num_unmaps = 0;  // extents mapped/unmapped (each pinned once)
  std::uint64_t num_ooms = 0;
  bool numa_bound = false;               // pages are bound with mbind
  std::vector<HostPoolNodeStats> nodes;  // ascending by node
};

class HostPool {
 public:
  // InvalidArgument for a node that does not exist; Unsupported for backend jemalloc without it.
  // The device must outlive the pool (Device::attach).
  explicit HostPool(Device& device, HostPoolOptions options = {});
  // Gives every page back; live buffers are reported in the log. Ends the process, naming both,
  // while an object attached to the pool lives (a SwapScheduler, an OffloadedAdam): their buffers
  // would be unmapped under them.
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  Device& device() const;
  const HostPoolOptions& options() const;
  HostPoolBackend backend() const;  // the one in effect (never automatic)

  // Pinned host memory of at least `bytes` (nullptr for 0). Throws OutOfMemory beyond the cap
  // or when the system refuses pages; the pool's state is then unchanged.
  void* allocate(std::size_t bytes);
  // InvalidArgument for a pointer this pool did not give, or a double free.
  void deallocate(void* ptr);

  bool owns(const void* ptr) const;
  std::size_t usable_size(const void* ptr) const;  // InvalidArgument for a foreign pointer
  int node_of(const void* ptr) const;              // -1 when unknown

  // Unpins and unmaps pages no live buffer uses; returns the bytes given back.
  std::size_t release_unused();

  HostPoolStats stats() const;
  void reset_peak_stats();

  // Lifetimes: registers an object that keeps buffers of this pool for its whole life; the pool
  // must outlive it (as Device::attach). `what` names the dependent.
  Dependency attach(std::string what);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True when jemalloc's mallocx/mallctl are present in this process (linked at start-up).
bool jemalloc_in_process();

}  // namespace stowage
