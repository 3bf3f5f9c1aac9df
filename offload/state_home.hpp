#pragma once
// Where one chunk of optimizer state lives: device memory from the allocator, host memory mapped
// into the device's address space, or pinned host memory for streaming. m and v of the chunk
// are one allocation, [m | v].
#include <cstddef>
#include <string>

#include "stowage/host_pool.hpp"
#include "stowage/memory_resource.hpp"
#include "stowage/offload.hpp"
#include "stowage/tensor.hpp"

namespace stowage::offload {

struct StateHome {
  StatePlacement where = StatePlacement::device;
  TensorView mv;        // 2 x len f32; device address space (device, mapped) or host (streamed)
  std::string mapping;  // mapped: "vmm-host-numa" or "mapped-pinned"
  std::size_t host_bytes = 0;
  std::size_t len = 0;
  TensorView m() const { return mv.slice(0, 0, static_cast<std::int64_t>(len)); }
  TensorView v() const { return mv.slice(0, static_cast<std::int64_t>(len), 2 * static_cast<std::int64_t>(len)); }
};

// Bytes the allocator charges for a device chunk of len elements.
std::size_t device_chunk_bytes(std::size_t len);

// Makes a home of `len` elements (contents undefined). Throws the device's error (after
// undoing what it did) when the memory cannot be had; mapped tries driver virtual memory with
// a host NUMA location first, then pinned host memory with a device address.
StateHome make_home(MemoryResource& allocator, HostPool& pool, StatePlacement where, std::size_t len, Stream stream);

// The copy direction between two homes' memory.
CopyKind copy_kind(StatePlacement from, StatePlacement to);

}  // namespace stowage::offload
