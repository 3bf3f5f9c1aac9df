// CUDA backend: properties, raw memory, streams, events, copies, pinning and host launches.
// Virtual memory is in cuda_vmm_cuda.cpp.
#include "device/cuda/cuda_device_cuda.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <iterator>

#include "device/cuda/cuda_check_cuda.hpp"
#include "device/cuda/cuda_driver_cuda.hpp"
#include "device/topology.hpp"

namespace stowage::detail {

CudaDevice::Current::Current(int ordinal) {
  check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
  // Always set: besides choosing the device, it makes the primary context current on this
  // thread, which the driver-API calls need (a fresh thread has none even when the device is 0).
  check_cuda(cudaSetDevice(ordinal), "cudaSetDevice");
}

CudaDevice::Current::~Current() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {
  Current current(ordinal_);
  check_cuda(cudaFree(nullptr), "cudaFree(0) (context creation)");  // primary context for the driver API
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, ordinal_), "cudaGetDeviceProperties");
  std::size_t free = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  check_cuda(cudaDeviceGetStreamPriorityRange(&least_priority_, &greatest_priority_),
             "cudaDeviceGetStreamPriorityRange");
  char bus[32] = {};
  check_cuda(cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal_), "cudaDeviceGetPCIBusId");

  props_.kind = DeviceKind::cuda;
  props_.ordinal = ordinal_;
  props_.name = prop.name;
  props_.capacity = total;
  props_.host_accessible = false;
  props_.dlpack_device_type = 2;  // kDLCUDA
  props_.pci_bus_id = bus;
  std::transform(props_.pci_bus_id.begin(), props_.pci_bus_id.end(), props_.pci_bus_id.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  props_.numa_nodes = numa_nodes_near_pci(props_.pci_bus_id);

  const DriverApi& api = driver_api();
  if (api.complete) {
    check_cu(api.deviceGet(&cu_device_, ordinal_), "cuDeviceGet");
    props_.virtual_memory = attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) != 0;
    props_.host_numa_memory =
        props_.virtual_memory && attribute(CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) != 0;
    posix_fd_ = attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) != 0;
    rdma_vmm_ = attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED) != 0;
    if (props_.virtual_memory) props_.granularity = granularity_for(Location::device());
    int node = -1;  // hwloc did not place the device: ask the driver
    if (props_.numa_nodes.empty() &&
        api.deviceGetAttribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, cu_device_) == CUDA_SUCCESS && node >= 0)
      props_.numa_nodes.push_back(node);
  }
}

CudaDevice::~CudaDevice() {
  check_no_dependents();
  release_everything();
}

void CudaDevice::release_everything() noexcept {
  // Best effort: the process may be shutting down with the driver already gone.
  try {
    Current current(ordinal_);
    cudaDeviceSynchronize();
    const DriverApi& api = driver_api();
    std::lock_guard lock(mu_);
    for (auto& [va, m] : mappings_) api.memUnmap(static_cast<CUdeviceptr>(va), m.bytes);
    for (auto& [h, c] : chunks_)
      if (!c.destroyed) api.memRelease(h);
    for (auto& [va, bytes] : reservations_) api.memAddressFree(static_cast<CUdeviceptr>(va), bytes);
    for (auto& [p, bytes] : allocations_) cudaFree(p);
    for (auto& [p, bytes] : pinned_) cudaHostUnregister(reinterpret_cast<void*>(p));
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
    for (auto& [e, timing] : events_) cudaEventDestroy(e);
    cudaGetLastError();
  } catch (...) {
  }
}

int CudaDevice::attribute(CUdevice_attribute attr) const {
  int value = 0;
  const DriverApi& api = driver_api();
  if (api.deviceGetAttribute == nullptr || api.deviceGetAttribute(&value, attr, cu_device_) != CUDA_SUCCESS) return 0;
  return value;
}

std::size_t CudaDevice::free_memory() const {
  Current current(ordinal_);
  std::size_t free = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

DeviceCounters CudaDevice::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

void* CudaDevice::allocate(std::size_t bytes) {
  if (bytes == 0) throw InvalidArgument("allocate: zero bytes");
  if (bytes > props_.capacity)
    throw OutOfMemory(fmt::format("allocate: {} bytes asked, device {} ({}) has {} bytes in all", bytes, ordinal_,
                                  props_.name, props_.capacity));
  Current current(ordinal_);
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw OutOfMemory(
        fmt::format("allocate: cudaMalloc of {} bytes failed: cudaErrorMemoryAllocation "
                    "(capacity {}, free {}); free cached blocks or lower the batch",
                    bytes, props_.capacity, free_memory()));
  }
  check_cuda(err, "cudaMalloc");
  std::lock_guard lock(mu_);
  allocations_.emplace(p, bytes);
  counters_.raw_allocated += bytes;
  return p;
}

void CudaDevice::deallocate(void* ptr) {
  std::size_t bytes = 0;
  {
    std::lock_guard lock(mu_);
    auto it = allocations_.find(ptr);
    if (it == allocations_.end())
      throw InvalidArgument(fmt::format("deallocate: {} was not allocated by device {}", ptr, ordinal_));
    bytes = it->second;
    allocations_.erase(it);
  }
  // cudaFree synchronises the device, so it runs without the lock host callbacks may need.
  Current current(ordinal_);
  const cudaError_t err = cudaFree(ptr);
  std::lock_guard lock(mu_);
  if (err != cudaSuccess) {
    allocations_.emplace(ptr, bytes);
    check_cuda(err, "cudaFree");
  }
  counters_.raw_allocated -= bytes;
}

// ---- streams ----

cudaStream_t CudaDevice::checked_stream(Stream stream) const {
  auto s = static_cast<cudaStream_t>(native(stream));
  if (destroyed_streams_.count(s) != 0 && streams_.count(s) == 0)
    throw InvalidArgument(fmt::format("stream {} was destroyed", native(stream)));
  return s;  // ours, the default stream, or a framework's stream: passed through
}

cudaEvent_t CudaDevice::checked_event(Event event) const {
  auto e = reinterpret_cast<cudaEvent_t>(static_cast<std::uintptr_t>(event));
  if (events_.count(e) == 0)
    throw InvalidArgument(fmt::format("event {} is not a live event of device {} (destroyed, or another device's)",
                                      static_cast<const void*>(e), ordinal_));
  return e;
}

std::pair<int, int> CudaDevice::priority_range() const {
  // [least, greatest] in CUDA's numbering (greatest is the most negative), as cudaDeviceGetStreamPriorityRange.
  return {least_priority_, greatest_priority_};
}

Stream CudaDevice::create_stream(int priority) {
  priority = std::clamp(priority, greatest_priority_, least_priority_);  // as CUDA clamps
  Current current(ordinal_);
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority), "cudaStreamCreateWithPriority");
  std::lock_guard lock(mu_);
  streams_.insert(s);
  destroyed_streams_.erase(s);
  return stream_from_native(s);
}

void CudaDevice::destroy_stream(Stream stream) {
  auto s = static_cast<cudaStream_t>(native(stream));
  const auto not_live = [&] {
    return InvalidArgument(
        fmt::format("destroy_stream: {} is not a live stream created by device {}", native(stream), ordinal_));
  };
  {
    std::lock_guard lock(mu_);
    if (streams_.count(s) == 0) throw not_live();
  }
  // The stream stays live until its work has finished (outside mu_: that may take a while):
  // whoever finds it destroyed may reuse what it used without ordering after it.
  Current current(ordinal_);
  check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  {
    std::lock_guard lock(mu_);
    if (streams_.count(s) == 0) throw not_live();  // destroyed meanwhile
    check_cuda(cudaStreamDestroy(s), "cudaStreamDestroy");
    streams_.erase(s);
    destroyed_streams_.insert(s);
  }
  {
    std::lock_guard errors_lock(errors_mu_);
    host_errors_.erase(s);
  }
  count_destroyed_stream();
}

void CudaDevice::check_stream(Stream stream) {
  auto s = static_cast<cudaStream_t>(native(stream));
  // The legacy default stream, cudaStreamLegacy and cudaStreamPerThread are always there.
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return;
  {
    std::lock_guard lock(mu_);
    if (streams_.count(s) != 0 || known_streams_.count(s) != 0) return;
    if (destroyed_streams_.count(s) != 0)
      throw InvalidArgument(fmt::format("stream {} of device {} was destroyed", native(stream), ordinal_));
  }
  // A stream a framework made: the runtime says whether it is one. (A value that is no stream
  // handle at all may not be detectable: the runtime dereferences what it is given.)
  Current current(ordinal_);
  unsigned int flags = 0;
  if (cudaStreamGetFlags(s, &flags) != cudaSuccess) {
    cudaGetLastError();
    throw InvalidArgument(fmt::format("{} is not a CUDA stream of device {}", native(stream), ordinal_));
  }
  std::lock_guard lock(mu_);
  known_streams_.insert(s);
}

void CudaDevice::rethrow_host_error(cudaStream_t stream) {
  std::exception_ptr error;
  {
    std::lock_guard lock(errors_mu_);
    auto it = host_errors_.find(stream);
    if (it == host_errors_.end()) return;
    error = it->second;
    host_errors_.erase(it);
  }
  std::rethrow_exception(error);
}

void CudaDevice::synchronize(Stream stream) {
  cudaStream_t s;
  {
    std::lock_guard lock(mu_);
    s = checked_stream(stream);
  }
  Current current(ordinal_);
  check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  rethrow_host_error(s);
}

void CudaDevice::synchronize() {
  Current current(ordinal_);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::exception_ptr error;
  {
    std::lock_guard lock(errors_mu_);
    if (!host_errors_.empty()) {
      error = host_errors_.begin()->second;
      host_errors_.clear();
    }
  }
  if (error) std::rethrow_exception(error);
}

// ---- events ----

Event CudaDevice::create_event(bool timing) {
  Current current(ordinal_);
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
             "cudaEventCreateWithFlags");
  std::lock_guard lock(mu_);
  events_[e] = timing;
  return Event{reinterpret_cast<std::uintptr_t>(e)};
}

void CudaDevice::destroy_event(Event event) {
  std::lock_guard lock(mu_);
  cudaEvent_t e = checked_event(event);
  Current current(ordinal_);
  check_cuda(cudaEventDestroy(e), "cudaEventDestroy");
  events_.erase(e);
}

void CudaDevice::record(Event event, Stream stream) {
  std::lock_guard lock(mu_);
  cudaEvent_t e = checked_event(event);
  cudaStream_t s = checked_stream(stream);
  Current current(ordinal_);
  check_cuda(cudaEventRecord(e, s), "cudaEventRecord");
}

void CudaDevice::wait(Stream stream, Event event) {
  std::lock_guard lock(mu_);
  cudaEvent_t e = checked_event(event);
  cudaStream_t s = checked_stream(stream);
  Current current(ordinal_);
  check_cuda(cudaStreamWaitEvent(s, e, 0), "cudaStreamWaitEvent");
}

bool CudaDevice::query(Event event) {
  cudaEvent_t e;
  {
    std::lock_guard lock(mu_);
    e = checked_event(event);
  }
  const cudaError_t err = cudaEventQuery(e);
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  check_cuda(err, "cudaEventQuery");
  return true;
}

void CudaDevice::synchronize(Event event) {
  cudaEvent_t e;
  {
    std::lock_guard lock(mu_);
    e = checked_event(event);
  }
  check_cuda(cudaEventSynchronize(e), "cudaEventSynchronize");
}

float CudaDevice::elapsed_ms(Event start, Event end) {
  cudaEvent_t a, b;
  {
    std::lock_guard lock(mu_);
    a = checked_event(start);
    b = checked_event(end);
    if (!events_.at(a) || !events_.at(b)) throw InvalidArgument("elapsed_ms: both events must be created with timing");
  }
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  return ms;
}

// ---- copies, fills, host launches ----

void CudaDevice::copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream stream) {
  if (bytes == 0) return;
  if (dst == nullptr || src == nullptr) throw InvalidArgument("copy_async: null pointer");
  cudaMemcpyKind k = cudaMemcpyDefault;
  switch (kind) {
    case CopyKind::host_to_device: k = cudaMemcpyHostToDevice; break;
    case CopyKind::device_to_host: k = cudaMemcpyDeviceToHost; break;
    case CopyKind::device_to_device: k = cudaMemcpyDeviceToDevice; break;
    case CopyKind::host_to_host: k = cudaMemcpyHostToHost; break;
  }
  std::lock_guard lock(mu_);
  cudaStream_t s = checked_stream(stream);
  Current current(ordinal_);
  check_cuda(cudaMemcpyAsync(dst, src, bytes, k, s), "cudaMemcpyAsync");
  if (kind == CopyKind::host_to_device) counters_.bytes_h2d += bytes;
  if (kind == CopyKind::device_to_host) counters_.bytes_d2h += bytes;
  if (kind == CopyKind::device_to_device) counters_.bytes_d2d += bytes;
}

void CudaDevice::fill_async(void* dst, std::uint8_t value, std::size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (dst == nullptr) throw InvalidArgument("fill_async: null pointer");
  std::lock_guard lock(mu_);
  cudaStream_t s = checked_stream(stream);
  Current current(ordinal_);
  check_cuda(cudaMemsetAsync(dst, value, bytes, s), "cudaMemsetAsync");
}

struct CudaDevice::HostCall {
  CudaDevice* device;
  cudaStream_t stream;
  std::function<void()> fn;
};

void CUDART_CB CudaDevice::run_host_call(void* data) {
  std::unique_ptr<HostCall> call(static_cast<HostCall*>(data));
  try {
    call->fn();
  } catch (...) {
    std::lock_guard lock(call->device->errors_mu_);
    call->device->host_errors_.emplace(call->stream, std::current_exception());  // keeps the first
  }
}

void CudaDevice::launch_host(Stream stream, std::function<void()> fn) {
  if (!fn) throw InvalidArgument("launch_host: empty function");
  std::lock_guard lock(mu_);
  cudaStream_t s = checked_stream(stream);
  auto call = std::make_unique<HostCall>(HostCall{this, s, std::move(fn)});
  Current current(ordinal_);
  check_cuda(cudaLaunchHostFunc(s, &CudaDevice::run_host_call, call.get()), "cudaLaunchHostFunc");
  call.release();  // owned by the callback now
}

// ---- pinned host memory ----

void CudaDevice::pin_host(void* ptr, std::size_t bytes) {
  if (ptr == nullptr || bytes == 0) throw InvalidArgument("pin_host: null pointer or zero bytes");
  const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
  std::unique_lock lock(mu_);
  auto next = pinned_.lower_bound(begin);
  if ((next != pinned_.end() && next->first < begin + bytes) ||
      (next != pinned_.begin() && std::prev(next)->first + std::prev(next)->second > begin))
    throw InvalidArgument(fmt::format("pin_host: [{}, +{}) overlaps memory already pinned", ptr, bytes));
  pinned_.emplace(begin, bytes);  // claimed now, registered below without the lock
  lock.unlock();
  Current current(ordinal_);
  const cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  lock.lock();
  if (err != cudaSuccess) {
    pinned_.erase(begin);
    check_cuda(err, "cudaHostRegister");
  }
  counters_.pinned_host += bytes;
}

void CudaDevice::unpin_host(void* ptr) {
  std::size_t bytes = 0;
  {
    std::lock_guard lock(mu_);
    auto it = pinned_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == pinned_.end())
      throw InvalidArgument(fmt::format("unpin_host: {} was not pinned by device {}", ptr, ordinal_));
    bytes = it->second;
    pinned_.erase(it);
  }
  Current current(ordinal_);  // unregistering may synchronise: not under the lock
  const cudaError_t err = cudaHostUnregister(ptr);
  std::lock_guard lock(mu_);
  if (err != cudaSuccess) {
    pinned_.emplace(reinterpret_cast<std::uintptr_t>(ptr), bytes);
    check_cuda(err, "cudaHostUnregister");
  }
  counters_.pinned_host -= bytes;
}

bool CudaDevice::is_pinned(const void* ptr) const {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(mu_);
  auto it = pinned_.upper_bound(p);
  return it != pinned_.begin() && p < std::prev(it)->first + std::prev(it)->second;
}

void* CudaDevice::device_pointer_of_host(void* host_ptr) {
  Current current(ordinal_);
  void* dev = nullptr;
  if (cudaHostGetDevicePointer(&dev, host_ptr, 0) != cudaSuccess) {
    cudaGetLastError();  // not pinned (or not mapped): no device address
    return nullptr;
  }
  return dev;
}

}  // namespace stowage::detail
