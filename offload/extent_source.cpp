#include "offload/extent_source.hpp"

#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/log.hpp"
#include "offload/host_memory.hpp"

namespace stowage::offload {
namespace {

std::size_t page_size() {
  static const std::size_t p = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

// Binds [ptr, ptr+bytes) to `node`; false when the kernel refuses (no NUMA, seccomp).
bool bind_to_node(void* ptr, std::size_t bytes, int node) {
  constexpr std::size_t kBits = 8 * sizeof(unsigned long);
  std::vector<unsigned long> mask(static_cast<std::size_t>(node) / kBits + 1, 0);
  mask[static_cast<std::size_t>(node) / kBits] |= 1UL << (static_cast<std::size_t>(node) % kBits);
  return ::mbind(ptr, bytes, MPOL_BIND, mask.data(), mask.size() * kBits + 1, 0) == 0;
}

// Faults every page in now (on the bound node), so pinning and first use do not; false when the
// kernel could not (out of memory). Touched page by page only where the kernel lacks the advice.
bool populate(void* ptr, std::size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (::madvise(ptr, bytes, MADV_POPULATE_WRITE) == 0) return true;
  if (errno != EINVAL) return false;
#endif
  auto* p = static_cast<volatile char*>(ptr);
  for (std::size_t off = 0; off < bytes; off += page_size()) p[off] = 0;
  return true;
}

// Whether `bytes` more can be faulted in (on `node`, when bound) without the OOM killer: a
// request beyond what the host has left is refused before any page is touched.
// `bytes`: every chunk being mapped now, this one included (they fault their pages at once).
// Never throws (reading the limits allocates; a failure there is no room).
bool host_has_room(std::size_t bytes, int node) noexcept {
  try {
    if (bytes > host_memory_available()) return false;
    if (node < 0 || numa_available() < 0) return true;
    if (const auto on_node = node_memory_available(node)) return bytes <= *on_node;
    const long long size = numa_node_size64(node, nullptr);
    return size < 0 || bytes <= static_cast<std::size_t>(size);
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

int numa_node_of_page(const void* ptr) {
  int node = -1;
  if (::get_mempolicy(&node, nullptr, 0, const_cast<void*>(ptr), MPOL_F_NODE | MPOL_F_ADDR) != 0) return -1;
  return node;
}

std::vector<int> numa_nodes_present() {
  std::vector<int> nodes;
  if (numa_available() < 0) return nodes;
  for (int n = 0; n <= numa_max_node(); ++n)
    if (numa_bitmask_isbitset(numa_all_nodes_ptr, static_cast<unsigned>(n))) nodes.push_back(n);
  return nodes;
}

ExtentSource::ExtentSource(Device& device, std::vector<int> nodes, std::size_t cap_bytes, bool pin)
    : device_(device), nodes_(std::move(nodes)), cap_(cap_bytes), pin_(pin) {}

ExtentSource::~ExtentSource() {
  std::lock_guard lock(mutex_);
  while (!chunks_.empty()) unmap_locked(chunks_.begin());
}

bool ExtentSource::would_fit(std::size_t bytes) const {
  std::lock_guard lock(mutex_);
  return cap_ == 0 || counters_.pinned_bytes + pending_ + bytes <= cap_;
}

void* ExtentSource::map(std::size_t bytes, std::size_t alignment) {
  const std::size_t page = page_size();
  if (bytes == 0 || bytes % page != 0) return nullptr;
  alignment = std::max(alignment, page);
  int node = -1;
  std::size_t in_flight = 0;
  {
    std::lock_guard lock(mutex_);
    if (cap_ != 0 && counters_.pinned_bytes + pending_ + bytes > cap_) return nullptr;
    pending_ += bytes;
    in_flight = pending_;
    if (!nodes_.empty()) node = nodes_[next_node_++ % nodes_.size()];
  }
  auto undo_pending = [&] {
    std::lock_guard lock(mutex_);
    pending_ -= bytes;
  };
  if (!host_has_room(in_flight, node)) {
    undo_pending();
    return nullptr;
  }
  // Over-map by the alignment and trim, so any power-of-two alignment is honoured.
  const std::size_t span = bytes + alignment - page;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    undo_pending();
    return nullptr;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (base + alignment - 1) & ~(alignment - 1);
  if (aligned > base) ::munmap(raw, aligned - base);
  if (aligned + bytes < base + span) ::munmap(reinterpret_cast<void*>(aligned + bytes), base + span - aligned - bytes);
  void* ptr = reinterpret_cast<void*>(aligned);

  if (node >= 0 && !bind_to_node(ptr, bytes, node))
    log().warn("host pool: mbind to node {} failed (errno {}); pages follow the default policy", node, errno);
  if (!populate(ptr, bytes)) {
    log().warn("host pool: faulting in {} bytes failed (errno {})", bytes, errno);
    ::munmap(ptr, bytes);
    undo_pending();
    return nullptr;
  }
  if (pin_) {
    try {
      device_.pin_host(ptr, bytes);
    } catch (const std::exception& e) {
      log().warn("host pool: pinning {} bytes failed: {}", bytes, e.what());
      ::munmap(ptr, bytes);
      undo_pending();
      return nullptr;
    }
  }
  const int landed = numa_node_of_page(ptr);
  std::lock_guard lock(mutex_);
  pending_ -= bytes;
  chunks_[aligned] = Chunk{bytes, landed >= 0 ? landed : node, 0};
  counters_.pinned_bytes += bytes;
  counters_.peak_pinned_bytes = std::max(counters_.peak_pinned_bytes, counters_.pinned_bytes);
  counters_.pinned_per_node[chunks_[aligned].node] += bytes;
  ++counters_.num_maps;
  return ptr;
}

void ExtentSource::unmap_locked(ChunkMap::iterator it) {
  void* ptr = reinterpret_cast<void*>(it->first);
  const Chunk c = it->second;
  if (pin_) {
    try {
      device_.unpin_host(ptr);
    } catch (const std::exception& e) {
      log().error("host pool: unpinning {} failed: {}", ptr, e.what());
    }
  }
  ::munmap(ptr, c.bytes);
  counters_.pinned_bytes -= c.bytes;
  auto n = counters_.pinned_per_node.find(c.node);
  if ((n->second -= c.bytes) == 0) counters_.pinned_per_node.erase(n);
  ++counters_.num_unmaps;
  chunks_.erase(it);
}

bool ExtentSource::unmap_whole(void* ptr, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  auto it = chunks_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == chunks_.end() || it->second.bytes != bytes || it->second.returned != 0) return false;
  unmap_locked(it);
  return true;
}

void ExtentSource::return_piece(void* ptr, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  auto found = find_locked(reinterpret_cast<std::uintptr_t>(ptr));
  if (found == chunks_.end()) {
    log().error("host pool: piece {} (+{}) is not from any chunk", ptr, bytes);
    return;
  }
  auto it = chunks_.erase(found, found);  // a mutable iterator to the same element
  it->second.returned += bytes;
  if (it->second.returned >= it->second.bytes) unmap_locked(it);
}

ExtentSource::ChunkMap::const_iterator ExtentSource::find_locked(std::uintptr_t addr) const {
  auto it = chunks_.upper_bound(addr);
  if (it == chunks_.begin()) return chunks_.end();
  --it;
  return addr < it->first + it->second.bytes ? it : chunks_.end();
}

bool ExtentSource::same_chunk(const void* a, std::size_t na, const void* b, std::size_t nb) const {
  std::lock_guard lock(mutex_);
  const auto ia = find_locked(reinterpret_cast<std::uintptr_t>(a));
  const auto ib = find_locked(reinterpret_cast<std::uintptr_t>(b));
  if (ia == chunks_.end() || ia != ib) return false;
  const auto end = ia->first + ia->second.bytes;
  return reinterpret_cast<std::uintptr_t>(a) + na <= end && reinterpret_cast<std::uintptr_t>(b) + nb <= end;
}

int ExtentSource::node_of(const void* ptr) const {
  std::lock_guard lock(mutex_);
  const auto it = find_locked(reinterpret_cast<std::uintptr_t>(ptr));
  return it == chunks_.end() ? -1 : it->second.node;
}

ExtentCounters ExtentSource::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

void ExtentSource::reset_peak() {
  std::lock_guard lock(mutex_);
  counters_.peak_pinned_bytes = counters_.pinned_bytes;
}

}  // namespace stowage::offload
