#include "offload/state_home.hpp"

#include <fmt/format.h>

namespace stowage::offload {
namespace {

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

// Host memory with a host NUMA location, mapped next to device memory by the driver's
// virtual-memory API. The storage's deleter unmaps and gives the chunk back.
StateHome mapped_by_vmm(Device& dev, std::size_t len) {
  const DeviceProperties& p = dev.properties();
  if (!p.virtual_memory || !p.host_numa_memory)
    throw Unsupported(fmt::format("device {} has no host-located virtual memory", p.ordinal));
  const std::size_t bytes = round_up(len * 8, p.granularity);
  const int node = p.numa_nodes.empty() ? -1 : p.numa_nodes.front();
  PhysicalOptions po;
  po.location = node >= 0 ? Location::host_numa(node) : Location::host();
  po.shareable = false;
  po.rdma_capable = false;
  const PhysicalHandle h = dev.create_physical(bytes, po);
  void* va = nullptr;
  bool mapped = false;
  try {
    va = dev.reserve(bytes);
    dev.map(va, bytes, h, 0);
    mapped = true;
    dev.set_access(va, bytes);
  } catch (...) {
    if (mapped) dev.unmap(va, bytes);
    if (va) dev.unreserve(va, bytes);
    dev.destroy_physical(h);
    throw;
  }
  StateHome home;
  home.where = StatePlacement::mapped;
  home.mapping = "vmm-host-numa";
  home.host_bytes = bytes;
  home.len = len;
  Storage s = Storage::wrap(dev, va, bytes, [&dev, va, bytes, h] {
    dev.unmap(va, bytes);
    dev.unreserve(va, bytes);
    dev.destroy_physical(h);
  });
  home.mv = TensorView(std::move(s), DType::f32, {2 * static_cast<std::int64_t>(len)});
  return home;
}

// A pool buffer; for `mapped` it must have a device address (mapped pinned memory).
StateHome from_pool(Device& dev, HostPool& pool, StatePlacement where, std::size_t len) {
  void* host = pool.allocate(len * 8);
  void* addr = host;
  if (where == StatePlacement::mapped) {
    addr = dev.device_pointer_of_host(host);
    if (!addr) {
      pool.deallocate(host);
      throw Unsupported(fmt::format("device {} gives pinned host memory no device address", dev.ordinal()));
    }
  }
  StateHome home;
  home.where = where;
  home.mapping = where == StatePlacement::mapped ? "mapped-pinned" : "";
  home.host_bytes = pool.usable_size(host);
  home.len = len;
  Storage s = Storage::wrap(dev, addr, len * 8, [&pool, host] { pool.deallocate(host); });
  home.mv = TensorView(std::move(s), DType::f32, {2 * static_cast<std::int64_t>(len)});
  return home;
}

}  // namespace

std::size_t device_chunk_bytes(std::size_t len) { return round_up(len * 8, 512); }

StateHome make_home(MemoryResource& allocator, HostPool& pool, StatePlacement where, std::size_t len, Stream stream) {
  Device& dev = allocator.device();
  if (where == StatePlacement::device) {
    StateHome home;
    home.len = len;
    home.mv = TensorView::empty(allocator, DType::f32, {2 * static_cast<std::int64_t>(len)}, stream);
    return home;
  }
  if (where == StatePlacement::streamed) return from_pool(dev, pool, where, len);
  try {
    return mapped_by_vmm(dev, len);
  } catch (const Error& vmm_error) {
    try {
      return from_pool(dev, pool, where, len);
    } catch (const OutOfMemory& e) {
      throw OutOfMemory(fmt::format("cannot map optimizer state into device {}: {}; pinned fallback: {}", dev.ordinal(),
                                    vmm_error.what(), e.what()));
    } catch (const Error& e) {
      throw DeviceError(fmt::format("cannot map optimizer state into device {}: {}; pinned fallback: {}", dev.ordinal(),
                                    vmm_error.what(), e.what()));
    }
  }
}

CopyKind copy_kind(StatePlacement from, StatePlacement to) {
  const bool from_host = from == StatePlacement::streamed, to_host = to == StatePlacement::streamed;
  if (from_host && to_host) return CopyKind::host_to_host;
  if (from_host) return CopyKind::host_to_device;
  if (to_host) return CopyKind::device_to_host;
  return CopyKind::device_to_device;
}

}  // namespace stowage::offload
