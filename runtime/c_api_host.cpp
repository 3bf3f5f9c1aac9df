// The C ABI of the pinned host pool: one pool per device, made on first use, for frameworks that
// keep memory on the host for the device (stowage.torch's swap and optimizer-state offload).
#include <dlpack/dlpack.h>
#include <fmt/format.h>

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/log.hpp"
#include "runtime/c_api_buffers.hpp"
#include "runtime/c_api_guard.hpp"
#include "runtime/devices_forked.hpp"
#include "stowage/dlpack.hpp"
#include "stowage/error.hpp"
#include "stowage/host_pool.hpp"
#include "stowage/runtime.hpp"
#include "stowage/stowage.h"

namespace stowage {
namespace {

using capi::guarded;

struct HostPools {
  std::mutex mutex;
  std::vector<std::unique_ptr<HostPool>> by_device;

  HostPool& get(int ordinal) {
    // In a forked child the mutex may be held for ever by a parent's thread, and the devices
    // (whose pinning the pages need) are the parent's: refused before the lock, for every device.
    refuse_if_devices_forked(fmt::format("host pool: device {}", ordinal));
    Device& d = stowage::device(ordinal);  // InvalidArgument for an ordinal that names no device
    const auto i = static_cast<std::size_t>(ordinal);
    std::lock_guard lock(mutex);
    if (by_device.size() <= i) by_device.resize(i + 1);
    if (!by_device[i]) by_device[i] = std::make_unique<HostPool>(d);
    return *by_device[i];
  }
};

HostPools& host_pools() {
  // Leaked on purpose, as the device allocators: frameworks free tensors during their own static
  // destruction.
  static auto* pools = new HostPools();
  return *pools;
}

// A pool buffer handed to a DLPack consumer; its deleter gives the buffer back.
struct HostExport {
  DLManagedTensor managed{};
  HostPool* pool = nullptr;
  std::vector<std::int64_t> shape, strides;
};

void delete_host_export(DLManagedTensor* managed) noexcept {
  std::unique_ptr<HostExport> e(static_cast<HostExport*>(managed->manager_ctx));
  try {
    e->pool->deallocate(managed->dl_tensor.data);
  } catch (const std::exception& ex) {  // a deleter cannot fail: say so, keep going
    log().error("stowage_dlpack_host_empty's deleter: {}", ex.what());
  } catch (...) {
    log().error("stowage_dlpack_host_empty's deleter: unknown error");
  }
}

nlohmann::json to_json(const HostPoolStats& s) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const HostPoolNodeStats& n : s.nodes)
    nodes.push_back({{"node", n.node}, {"pinned_bytes", n.pinned_bytes}, {"in_use_bytes", n.in_use_bytes}});
  return {{"backend", s.backend},
          {"cap_bytes", s.cap_bytes},
          {"pinned_bytes", s.pinned_bytes},
          {"peak_pinned_bytes", s.peak_pinned_bytes},
          {"in_use_bytes", s.in_use_bytes},
          {"peak_in_use_bytes", s.peak_in_use_bytes},
          {"requested_bytes", s.requested_bytes},
          {"live_buffers", s.live_buffers},
          {"num_allocs", s.num_allocs},
          {"num_frees", s.num_frees},
          {"num_maps", s.num_maps},
          {"num_unmaps", s.num_unmaps},
          {"num_ooms", s.num_ooms},
          {"numa_bound", s.numa_bound},
          {"nodes", std::move(nodes)}};
}

}  // namespace
}  // namespace stowage

using namespace stowage;

extern "C" {

void* stowage_host_malloc(ssize_t size, int device) {
  return guarded<void*>(
      nullptr, [&] { return host_pools().get(device).allocate(capi::checked_size(size, "stowage_host_malloc")); });
}

int stowage_host_free(void* ptr, int device) {
  return guarded(-1, [&] {
    if (ptr == nullptr) return 0;
    HostPool& pool = host_pools().get(device);
    try {
      pool.deallocate(ptr);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("stowage_host_free on device {}: {}", device, e.what()));
    }
    return 0;
  });
}

DLManagedTensor* stowage_dlpack_host_empty(int device, const int64_t* shape, int ndim, uint8_t code, uint8_t bits) {
  return guarded<DLManagedTensor*>(nullptr, [&] {
    const DLDataType type{code, bits, 1};
    const std::size_t bytes = capi::tensor_bytes(shape, ndim, dtype_from_dlpack(type, "stowage_dlpack_host_empty"),
                                                 "stowage_dlpack_host_empty");
    HostPool& pool = host_pools().get(device);
    auto e = std::make_unique<HostExport>();
    e->pool = &pool;
    e->shape.assign(shape, shape + ndim);
    e->strides.resize(e->shape.size());
    // Unsigned: a tensor with a 0 dimension may name others whose product overflows int64.
    std::uint64_t stride = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      e->strides[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(stride);
      stride *= static_cast<std::uint64_t>(e->shape[static_cast<std::size_t>(i)]);
    }
    DLTensor& t = e->managed.dl_tensor;
    t.data = pool.allocate(bytes);  // last: nothing after it can fail
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = ndim;
    t.dtype = type;
    t.shape = e->shape.data();
    t.strides = e->strides.data();
    t.byte_offset = 0;
    e->managed.manager_ctx = e.get();
    e->managed.deleter = &delete_host_export;
    return &e.release()->managed;
  });
}

void* stowage_host_device_pointer(void* ptr, int device) {
  return guarded<void*>(nullptr, [&] {
    HostPool& pool = host_pools().get(device);
    if (!pool.owns(ptr))
      throw InvalidArgument(
          fmt::format("stowage_host_device_pointer: {} is not a live buffer of device {}'s host pool", ptr, device));
    void* addr = pool.device().device_pointer_of_host(ptr);
    if (addr == nullptr)
      throw Unsupported(
          fmt::format("stowage_host_device_pointer: device {} gives pinned host memory no device address", device));
    return addr;
  });
}

ssize_t stowage_host_stats(int device, char* buf, size_t len) {
  return guarded<ssize_t>(-1, [&]() -> ssize_t {
    capi::check_buffer(buf, len, "stowage_host_stats");
    return capi::copy_out(to_json(host_pools().get(device).stats()).dump(), buf, len);
  });
}

ssize_t stowage_host_release_unused(int device) {
  return guarded<ssize_t>(-1, [&] { return static_cast<ssize_t>(host_pools().get(device).release_unused()); });
}

}  // extern "C"
