// CUDA backend, virtual memory: address reservations, physical chunks (device, host, host NUMA
// node), mappings and access, through the driver entry points found at run time.
#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "device/cuda/cuda_check_cuda.hpp"
#include "device/cuda/cuda_device_cuda.hpp"
#include "device/cuda/cuda_driver_cuda.hpp"
#include "device/topology.hpp"

namespace stowage::detail {
namespace {

CUmemLocation to_cu(const Location& location, int ordinal) {
  CUmemLocation loc{};
  switch (location.kind) {
    case Location::Kind::device:
      loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
      loc.id = ordinal;
      break;
    case Location::Kind::host:
      loc.type = CU_MEM_LOCATION_TYPE_HOST;
      loc.id = 0;
      break;
    case Location::Kind::host_numa:
      loc.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
      loc.id = location.numa_node;
      break;
  }
  return loc;
}

const char* describe(const Location& location) {
  switch (location.kind) {
    case Location::Kind::device: return "device";
    case Location::Kind::host: return "host";
    case Location::Kind::host_numa: return "host NUMA node";
  }
  return "?";
}

}  // namespace

std::size_t CudaDevice::granularity_for(const Location& location) const {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = to_cu(location, ordinal_);
  std::size_t granularity = 0;
  check_cu(driver_api().memGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           "cuMemGetAllocationGranularity");
  return granularity;
}

static void require_vmm(const DeviceProperties& props, const char* what) {
  if (!props.virtual_memory)
    throw Unsupported(fmt::format("{}: device {} ({}) has no virtual-memory support ({})", what, props.ordinal,
                                  props.name, driver_api().complete ? "driver says no" : driver_api().missing));
}

static void require_granular(std::size_t value, std::size_t granularity, const char* what, const char* name) {
  if (value % granularity != 0)
    throw InvalidArgument(
        fmt::format("{}: {} {} is not a multiple of the granularity {}", what, name, value, granularity));
}

bool CudaDevice::range_in_reservation(std::uintptr_t va, std::size_t bytes) const {
  auto it = reservations_.upper_bound(va);
  if (it == reservations_.begin()) return false;
  --it;
  return va >= it->first && va + bytes <= it->first + it->second && va + bytes > va;
}

void* CudaDevice::reserve(std::size_t bytes) {
  require_vmm(props_, "reserve");
  if (bytes == 0) throw InvalidArgument("reserve: zero bytes");
  require_granular(bytes, props_.granularity, "reserve", "size");
  Current current(ordinal_);
  CUdeviceptr va = 0;
  check_cu(driver_api().memAddressReserve(&va, bytes, props_.granularity, 0, 0), "cuMemAddressReserve");
  std::lock_guard lock(mu_);
  reservations_.emplace(static_cast<std::uintptr_t>(va), bytes);
  counters_.reserved_address += bytes;
  return reinterpret_cast<void*>(va);
}

void CudaDevice::unreserve(void* base, std::size_t bytes) {
  const auto va = reinterpret_cast<std::uintptr_t>(base);
  std::lock_guard lock(mu_);
  auto it = reservations_.find(va);
  if (it == reservations_.end() || it->second != bytes)
    throw InvalidArgument(fmt::format("unreserve: [{}, +{}) is not a reservation of device {}", base, bytes, ordinal_));
  auto m = mappings_.lower_bound(va);
  if (m != mappings_.end() && m->first < va + bytes)
    throw InvalidArgument(fmt::format("unreserve: [{}, +{}) still has mappings; unmap them first", base, bytes));
  Current current(ordinal_);
  check_cu(driver_api().memAddressFree(static_cast<CUdeviceptr>(va), bytes), "cuMemAddressFree");
  reservations_.erase(it);
  counters_.reserved_address -= bytes;
}

PhysicalHandle CudaDevice::create_physical(std::size_t bytes, const PhysicalOptions& options) {
  require_vmm(props_, "create_physical");
  const Location& where = options.location;
  if (where.kind != Location::Kind::device && !props_.host_numa_memory)
    throw Unsupported(
        fmt::format("create_physical: {} memory through the virtual-memory API is not supported by "
                    "device {} ({}) or its driver",
                    describe(where), ordinal_, props_.name));
  if (where.kind == Location::Kind::host_numa && (where.numa_node < 0 || where.numa_node >= numa_node_count()))
    throw InvalidArgument(fmt::format("create_physical: NUMA node {} does not exist (the host has {})", where.numa_node,
                                      numa_node_count()));
  if (bytes == 0) throw InvalidArgument("create_physical: zero bytes");
  const std::size_t granularity = where.kind == Location::Kind::device ? props_.granularity : granularity_for(where);
  require_granular(bytes, granularity, "create_physical", "size");
  if (where.kind == Location::Kind::device && bytes > props_.capacity)
    throw OutOfMemory(
        fmt::format("create_physical: {} bytes asked, device {} has {} in all", bytes, ordinal_, props_.capacity));

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = to_cu(where, ordinal_);
  // Plain host chunks cannot carry a shareable handle (the driver rejects any requested type).
  const bool shareable = options.shareable && posix_fd_ && where.kind != Location::Kind::host;
  if (shareable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (options.rdma_capable && rdma_vmm_ && where.kind == Location::Kind::device)
    prop.allocFlags.gpuDirectRDMACapable = 1;

  Current current(ordinal_);
  CUmemGenericAllocationHandle handle = 0;
  check_cu(driver_api().memCreate(&handle, bytes, &prop, 0), "cuMemCreate");
  std::lock_guard lock(mu_);
  chunks_.emplace(handle, Chunk{bytes, granularity, where, shareable});
  if (where.kind == Location::Kind::device) counters_.physical_allocated += bytes;
  return PhysicalHandle{static_cast<std::uintptr_t>(handle)};
}

void CudaDevice::drop_chunk_if_unused(CUmemGenericAllocationHandle handle) {
  auto it = chunks_.find(handle);
  if (it == chunks_.end() || it->second.mappings > 0 || !it->second.destroyed) return;
  if (it->second.location.kind == Location::Kind::device) counters_.physical_allocated -= it->second.bytes;
  chunks_.erase(it);
}

void CudaDevice::destroy_physical(PhysicalHandle handle) {
  const auto h = static_cast<CUmemGenericAllocationHandle>(handle);
  std::lock_guard lock(mu_);
  auto it = chunks_.find(h);
  if (it == chunks_.end() || it->second.destroyed)
    throw InvalidArgument("destroy_physical: not a live physical chunk of this device");
  // Releasing a mapped chunk is allowed: the driver frees it at the last unmap, and so do the counters.
  Current current(ordinal_);
  check_cu(driver_api().memRelease(h), "cuMemRelease");
  it->second.destroyed = true;
  drop_chunk_if_unused(h);
}

void CudaDevice::map(void* va, std::size_t bytes, PhysicalHandle handle, std::size_t offset) {
  require_vmm(props_, "map");
  const auto begin = reinterpret_cast<std::uintptr_t>(va);
  const auto h = static_cast<CUmemGenericAllocationHandle>(handle);
  std::lock_guard lock(mu_);
  auto chunk = chunks_.find(h);
  if (chunk == chunks_.end() || chunk->second.destroyed)
    throw InvalidArgument("map: not a live physical chunk of this device");
  if (bytes == 0) throw InvalidArgument("map: zero bytes");
  const std::size_t granularity = std::max(props_.granularity, chunk->second.granularity);
  require_granular(bytes, granularity, "map", "size");
  require_granular(offset, granularity, "map", "offset");
  require_granular(begin, granularity, "map", "address");
  if (offset > chunk->second.bytes || bytes > chunk->second.bytes - offset)
    throw InvalidArgument(
        fmt::format("map: [{}, +{}) runs past the chunk's {} bytes", offset, bytes, chunk->second.bytes));
  // On an H100 with driver 580, a test that maps half of a chunk failed with cuMemMap's
  // CUDA_ERROR_NOT_SUPPORTED; whole chunks at offset 0, all the allocator and offload map, work.
  if (offset != 0 || bytes != chunk->second.bytes)
    throw Unsupported(
        fmt::format("map: [{}, +{}) is part of a {}-byte chunk; the CUDA driver maps a chunk whole "
                    "(properties().partial_mapping is false)",
                    offset, bytes, chunk->second.bytes));
  if (!range_in_reservation(begin, bytes))
    throw InvalidArgument(fmt::format("map: [{}, +{}) is not inside one reservation", va, bytes));
  auto next = mappings_.lower_bound(begin);
  if ((next != mappings_.end() && next->first < begin + bytes) ||
      (next != mappings_.begin() && std::prev(next)->first + std::prev(next)->second.bytes > begin))
    throw InvalidArgument(fmt::format("map: [{}, +{}) overlaps an existing mapping", va, bytes));
  Current current(ordinal_);
  check_cu(driver_api().memMap(static_cast<CUdeviceptr>(begin), bytes, offset, h, 0), "cuMemMap");
  mappings_.emplace(begin, Mapping{bytes, h, chunk->second.location});
  ++chunk->second.mappings;
}

void CudaDevice::unmap(void* va, std::size_t bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(va);
  std::lock_guard lock(mu_);
  // The range must be exactly a run of whole, adjacent mappings.
  auto first = mappings_.find(begin);
  auto it = first;
  std::uintptr_t at = begin;
  while (it != mappings_.end() && it->first == at && at < begin + bytes) {
    at += it->second.bytes;
    ++it;
  }
  if (bytes == 0 || first == mappings_.end() || at != begin + bytes)
    throw InvalidArgument(fmt::format("unmap: [{}, +{}) is not exactly mapped memory", va, bytes));
  Current current(ordinal_);
  while (first != it) {
    check_cu(driver_api().memUnmap(static_cast<CUdeviceptr>(first->first), first->second.bytes), "cuMemUnmap");
    const auto h = first->second.handle;
    first = mappings_.erase(first);
    --chunks_[h].mappings;
    drop_chunk_if_unused(h);
  }
}

void CudaDevice::set_access(void* va, std::size_t bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(va);
  std::lock_guard lock(mu_);
  auto first = mappings_.upper_bound(begin);
  if (first != mappings_.begin()) --first;
  // Check first that mappings cover the whole range, so a bad range changes nothing.
  std::uintptr_t at = begin;
  auto last = first;
  while (at < begin + bytes && last != mappings_.end() && last->first <= at && at < last->first + last->second.bytes) {
    at = last->first + last->second.bytes;
    ++last;
  }
  if (bytes == 0 || at < begin + bytes)
    throw InvalidArgument(fmt::format("set_access: [{}, +{}) is not entirely mapped", va, bytes));

  Current current(ordinal_);
  at = begin;
  for (auto it = first; it != last; ++it) {
    const std::uintptr_t end = std::min<std::uintptr_t>(begin + bytes, it->first + it->second.bytes);
    CUmemAccessDesc desc[2] = {};
    desc[0].location = to_cu(Location::device(), ordinal_);
    desc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    const auto ptr = static_cast<CUdeviceptr>(at);
    if (it->second.location.kind == Location::Kind::device) {
      check_cu(driver_api().memSetAccess(ptr, end - at, desc, 1), "cuMemSetAccess");
    } else {
      // Host chunks: the host may touch them too (HOST_NUMA access; its id is ignored). Where the
      // driver refuses host access, the device's access alone is still granted.
      desc[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
      desc[1].location.id = 0;
      desc[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      if (driver_api().memSetAccess(ptr, end - at, desc, 2) != CUDA_SUCCESS)
        check_cu(driver_api().memSetAccess(ptr, end - at, desc, 1), "cuMemSetAccess");
    }
    at = end;
  }
}

int CudaDevice::export_handle(PhysicalHandle handle) {
  const auto h = static_cast<CUmemGenericAllocationHandle>(handle);
  std::lock_guard lock(mu_);
  auto it = chunks_.find(h);
  if (it == chunks_.end() || it->second.destroyed)
    throw InvalidArgument("export_handle: not a live physical chunk of this device");
  if (!it->second.shareable) return -1;
  int fd = -1;
  check_cu(driver_api().memExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
           "cuMemExportToShareableHandle");
  return fd;
}

}  // namespace stowage::detail
