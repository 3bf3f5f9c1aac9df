#include "device/emulated/emulated_memory.hpp"

#include <fmt/format.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.hpp"
#include "device/topology.hpp"

namespace stowage::emulated {
namespace {

constexpr std::size_t kPage = 4096;

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

std::string bytes_str(std::size_t n) { return fmt::format("{} B ({:.1f} MiB)", n, n / 1048576.0); }

void* map_anonymous(std::size_t bytes, int prot) {
  void* p = ::mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// Binds [va, va+bytes) to one NUMA node before first touch (no-op without NUMA support).
void bind_to_node(void* va, std::size_t bytes, int node) {
  if (node < 0 || numa_available() < 0 || node > numa_max_node()) return;
  unsigned long mask[16] = {};
  mask[node / (8 * sizeof(unsigned long))] |= 1UL << (node % (8 * sizeof(unsigned long)));
  ::mbind(va, bytes, MPOL_BIND, mask, sizeof(mask) * 8, 0);
}

}  // namespace

Memory::Memory(int ordinal, std::size_t capacity, std::size_t granularity)
    : ordinal_(ordinal), capacity_(capacity), granularity_(granularity) {}

Memory::~Memory() {
  for (auto& [addr, size] : raw_) ::munmap(reinterpret_cast<void*>(addr), size);
  for (auto& [base, r] : reservations_) ::munmap(r.raw, r.raw_size);
  for (auto& [id, c] : chunks_) ::close(c.fd);
}

std::string Memory::where() const { return fmt::format("emulated device {}", ordinal_); }

std::size_t Memory::used() const {
  std::lock_guard lock(mutex_);
  return used_;
}

DeviceCounters Memory::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

void Memory::check_granular(std::size_t value, const char* what) const {
  if (value == 0 || value % granularity_ != 0)
    throw InvalidArgument(
        fmt::format("{}: {} {} is not a positive multiple of the granularity {}", where(), what, value, granularity_));
}

void Memory::charge(std::size_t bytes, const char* what) {
  if (bytes > capacity_ - used_)
    throw OutOfMemory(fmt::format("{}: {} of {} does not fit: capacity {}, in use {}, free {}", where(), what,
                                  bytes_str(bytes), bytes_str(capacity_), bytes_str(used_),
                                  bytes_str(capacity_ - used_)));
  used_ += bytes;
}

void* Memory::allocate(std::size_t bytes) {
  if (bytes == 0) throw InvalidArgument(where() + ": allocation of 0 bytes");
  // Past the capacity it is refused as it is (OutOfMemory): rounding it up could wrap to 0.
  const std::size_t size = bytes > capacity_ ? bytes : round_up(bytes, kPage);
  std::lock_guard lock(mutex_);
  charge(size, "allocation");
  void* p = map_anonymous(size, PROT_READ | PROT_WRITE);
  if (!p) {
    used_ -= size;
    throw OutOfMemory(
        fmt::format("{}: the host could not back {} ({})", where(), bytes_str(size), std::strerror(errno)));
  }
  raw_[reinterpret_cast<std::uintptr_t>(p)] = size;
  counters_.raw_allocated += size;
  return p;
}

void Memory::deallocate(void* ptr) {
  std::lock_guard lock(mutex_);
  auto it = raw_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == raw_.end())
    throw InvalidArgument(fmt::format("{}: {} was not allocated by this device (or was freed already)", where(), ptr));
  ::munmap(ptr, it->second);
  used_ -= it->second;
  counters_.raw_allocated -= it->second;
  raw_.erase(it);
}

void* Memory::reserve(std::size_t bytes) {
  check_granular(bytes, "reservation size");
  const std::size_t raw_size = bytes + granularity_;
  void* raw = map_anonymous(raw_size, PROT_NONE);
  if (!raw) {
    const int err = errno;
    rlimit limit{};
    const bool limited = ::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY;
    throw OutOfMemory(fmt::format("{}: cannot reserve {} of address space ({}{})", where(), bytes_str(bytes),
                                  std::strerror(err),
                                  limited ? fmt::format("; the process's address-space limit, ulimit -v, is {}",
                                                        bytes_str(static_cast<std::size_t>(limit.rlim_cur)))
                                          : std::string()));
  }
  const auto base = round_up(reinterpret_cast<std::uintptr_t>(raw), granularity_);
  std::lock_guard lock(mutex_);
  reservations_[base] = Reservation{bytes, raw, raw_size, {}};
  counters_.reserved_address += bytes;
  return reinterpret_cast<void*>(base);
}

void Memory::unreserve(void* base, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  auto it = reservations_.find(reinterpret_cast<std::uintptr_t>(base));
  if (it == reservations_.end() || it->second.size != bytes)
    throw InvalidArgument(fmt::format("{}: no reservation of {} B at {}", where(), bytes, base));
  if (!it->second.mappings.empty())
    throw InvalidArgument(fmt::format("{}: reservation at {} still has {} mapping(s); unmap first", where(), base,
                                      it->second.mappings.size()));
  ::munmap(it->second.raw, it->second.raw_size);
  counters_.reserved_address -= bytes;
  reservations_.erase(it);
}

PhysicalHandle Memory::create_physical(std::size_t bytes, const PhysicalOptions& options) {
  check_granular(bytes, "physical chunk size");
  const bool on_device = options.location.kind == Location::Kind::device;
  if (options.location.kind == Location::Kind::host_numa &&
      (options.location.numa_node < 0 || options.location.numa_node >= detail::numa_node_count()))
    throw InvalidArgument(fmt::format("{}: create_physical: NUMA node {} does not exist (the host has {})", where(),
                                      options.location.numa_node, detail::numa_node_count()));
  std::lock_guard lock(mutex_);
  if (on_device) charge(bytes, "physical chunk");
  int fd = ::memfd_create("stowage-physical", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    if (fd >= 0) ::close(fd);
    if (on_device) used_ -= bytes;
    throw OutOfMemory(
        fmt::format("{}: cannot create a physical chunk of {} ({})", where(), bytes_str(bytes), std::strerror(errno)));
  }
  const std::uintptr_t id = next_chunk_++;
  chunks_[id] = Chunk{fd, bytes, options, 0, false};
  if (on_device) counters_.physical_allocated += bytes;
  return PhysicalHandle{id};
}

void Memory::drop_chunk_ref(std::uintptr_t id) {
  auto it = chunks_.find(id);
  Chunk& c = it->second;
  if (c.mappings > 0 || !c.destroyed) return;
  ::close(c.fd);
  if (c.options.location.kind == Location::Kind::device) {
    used_ -= c.size;
    counters_.physical_allocated -= c.size;
  }
  chunks_.erase(it);
}

void Memory::destroy_physical(PhysicalHandle handle) {
  std::lock_guard lock(mutex_);
  const auto id = static_cast<std::uintptr_t>(handle);
  auto it = chunks_.find(id);
  if (it == chunks_.end() || it->second.destroyed)
    throw InvalidArgument(fmt::format("{}: unknown physical handle {}", where(), id));
  it->second.destroyed = true;  // freed now, or at the last unmap (as the driver does)
  drop_chunk_ref(id);
}

Memory::Reservation& Memory::reservation_of(std::uintptr_t va, std::size_t bytes, const char* op) {
  auto it = reservations_.upper_bound(va);
  if (it != reservations_.begin()) {
    --it;
    if (va >= it->first && va + bytes <= it->first + it->second.size) return it->second;
  }
  throw InvalidArgument(fmt::format("{}: {} of [{:#x}, +{}) is outside every reservation", where(), op, va, bytes));
}

void Memory::map(void* va_ptr, std::size_t bytes, PhysicalHandle handle, std::size_t offset) {
  const auto va = reinterpret_cast<std::uintptr_t>(va_ptr);
  check_granular(bytes, "map size");
  if (va % granularity_ != 0 || offset % granularity_ != 0)
    throw InvalidArgument(
        fmt::format("{}: map address {:#x} / offset {} not aligned to {}", where(), va, offset, granularity_));
  std::lock_guard lock(mutex_);
  auto cit = chunks_.find(static_cast<std::uintptr_t>(handle));
  if (cit == chunks_.end() || cit->second.destroyed)
    throw InvalidArgument(fmt::format("{}: unknown physical handle {}", where(), static_cast<std::uintptr_t>(handle)));
  if (offset + bytes > cit->second.size)
    throw InvalidArgument(
        fmt::format("{}: map of {} B at offset {} exceeds the chunk's {} B", where(), bytes, offset, cit->second.size));
  Reservation& r = reservation_of(va, bytes, "map");
  auto next = r.mappings.lower_bound(va);
  if (next != r.mappings.end() && next->first < va + bytes)
    throw InvalidArgument(fmt::format("{}: [{:#x}, +{}) overlaps an existing mapping", where(), va, bytes));
  if (next != r.mappings.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > va)
      throw InvalidArgument(fmt::format("{}: [{:#x}, +{}) overlaps an existing mapping", where(), va, bytes));
  }
  // Mapped without access, as the driver does: set_access makes it usable.
  void* p = ::mmap(va_ptr, bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, cit->second.fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) throw DeviceError(fmt::format("{}: mmap failed: {}", where(), std::strerror(errno)));
  // The chunk is shared memory: through a forked child's copy of this mapping the child would write
  // the parent's device memory. The child gets no such mapping, as a CUDA context does not survive fork().
  if (::madvise(va_ptr, bytes, MADV_DONTFORK) != 0)
    log().warn("{}: madvise(MADV_DONTFORK) of [{:#x}, +{}) failed: {}", where(), va, bytes, std::strerror(errno));
  if (cit->second.options.location.kind == Location::Kind::host_numa)
    bind_to_node(va_ptr, bytes, cit->second.options.location.numa_node);
  r.mappings[va] = Mapping{bytes, cit->first, false};
  ++cit->second.mappings;
}

void Memory::unmap(void* va_ptr, std::size_t bytes) {
  const auto va = reinterpret_cast<std::uintptr_t>(va_ptr);
  std::lock_guard lock(mutex_);
  Reservation& r = reservation_of(va, bytes, "unmap");
  // The range must be a union of whole mappings with no holes.
  std::uintptr_t at = va;
  auto it = r.mappings.find(va);
  auto first = it;
  while (at < va + bytes) {
    if (it == r.mappings.end() || it->first != at || at + it->second.size > va + bytes)
      throw InvalidArgument(
          fmt::format("{}: [{:#x}, +{}) is not a run of whole mappings (at {:#x})", where(), va, bytes, at));
    at += it->second.size;
    ++it;
  }
  // Back to an inaccessible reservation; the range stays ours either way, so a refusal (the
  // kernel out of map entries) only leaves the pages readable until the range is unreserved.
  if (::mmap(va_ptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
    log().warn("{}: could not make [{:#x}, +{}) inaccessible again: {}", where(), va, bytes, std::strerror(errno));
  for (auto m = first; m != it;) {
    const auto chunk = m->second.chunk;
    m = r.mappings.erase(m);
    --chunks_[chunk].mappings;
    drop_chunk_ref(chunk);
  }
}

void Memory::set_access(void* va_ptr, std::size_t bytes) {
  const auto va = reinterpret_cast<std::uintptr_t>(va_ptr);
  std::lock_guard lock(mutex_);
  Reservation& r = reservation_of(va, bytes, "set_access");
  std::uintptr_t at = va;
  auto it = r.mappings.upper_bound(va);
  if (it == r.mappings.begin()) throw InvalidArgument(fmt::format("{}: set_access on unmapped {:#x}", where(), va));
  --it;
  std::vector<Mapping*> touched;
  while (at < va + bytes) {
    if (it == r.mappings.end() || it->first > at || it->first + it->second.size <= at)
      throw InvalidArgument(fmt::format("{}: set_access on [{:#x}, +{}): {:#x} is not mapped", where(), va, bytes, at));
    touched.push_back(&it->second);
    at = it->first + it->second.size;
    ++it;
  }
  if (::mprotect(va_ptr, bytes, PROT_READ | PROT_WRITE) != 0)
    throw DeviceError(fmt::format("{}: mprotect failed: {}", where(), std::strerror(errno)));
  for (auto* m : touched) m->accessible = true;
}

int Memory::export_handle(PhysicalHandle handle) {
  std::lock_guard lock(mutex_);
  auto it = chunks_.find(static_cast<std::uintptr_t>(handle));
  if (it == chunks_.end() || it->second.destroyed)
    throw InvalidArgument(fmt::format("{}: unknown physical handle {}", where(), static_cast<std::uintptr_t>(handle)));
  return it->second.options.shareable ? ::dup(it->second.fd) : -1;
}

void Memory::pin(void* ptr, std::size_t bytes) {
  if (!ptr || bytes == 0) throw InvalidArgument(where() + ": pin of a null or empty range");
  const auto a = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(mutex_);
  auto next = pinned_.lower_bound(a);
  const bool overlaps_next = next != pinned_.end() && next->first < a + bytes;
  const bool overlaps_prev = next != pinned_.begin() && std::prev(next)->first + std::prev(next)->second > a;
  if (overlaps_next || overlaps_prev)
    throw InvalidArgument(fmt::format("{}: [{}, +{}) overlaps memory pinned already", where(), ptr, bytes));
  pinned_[a] = bytes;
  counters_.pinned_host += bytes;
}

void Memory::unpin(void* ptr) {
  std::lock_guard lock(mutex_);
  auto it = pinned_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == pinned_.end()) throw InvalidArgument(fmt::format("{}: {} is not the start of pinned memory", where(), ptr));
  counters_.pinned_host -= it->second;
  pinned_.erase(it);
}

bool Memory::is_pinned(const void* ptr) const {
  const auto a = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(mutex_);
  auto it = pinned_.upper_bound(a);
  if (it == pinned_.begin()) return false;
  --it;
  return a < it->first + it->second;
}

}  // namespace stowage::emulated
