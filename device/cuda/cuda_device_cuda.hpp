#pragma once
// The CUDA backend: runtime API for streams, events, copies and host launches; the driver's
// virtual-memory API (reached through cuda_driver_cuda.hpp) for reservations and chunks.
// Every handle it hands out is tracked, so a destroyed or foreign one is an InvalidArgument
// rather than undefined behaviour inside the driver.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "stowage/device.hpp"

namespace stowage::detail {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal);
  ~CudaDevice() override;

  const DeviceProperties& properties() const override { return props_; }
  std::size_t free_memory() const override;
  DeviceCounters counters() const override;

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr) override;

  void* reserve(std::size_t bytes) override;
  void unreserve(void* base, std::size_t bytes) override;
  PhysicalHandle create_physical(std::size_t bytes, const PhysicalOptions& options) override;
  void destroy_physical(PhysicalHandle handle) override;
  void map(void* va, std::size_t bytes, PhysicalHandle handle, std::size_t offset) override;
  void unmap(void* va, std::size_t bytes) override;
  void set_access(void* va, std::size_t bytes) override;
  int export_handle(PhysicalHandle handle) override;

  Stream create_stream(int priority) override;
  void destroy_stream(Stream stream) override;
  void check_stream(Stream stream) override;
  std::pair<int, int> priority_range() const override;
  void synchronize(Stream stream) override;
  void synchronize() override;

  Event create_event(bool timing) override;
  void destroy_event(Event event) override;
  void record(Event event, Stream stream) override;
  void wait(Stream stream, Event event) override;
  bool query(Event event) override;
  void synchronize(Event event) override;
  float elapsed_ms(Event start, Event end) override;

  void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream stream) override;
  void fill_async(void* dst, std::uint8_t value, std::size_t bytes, Stream stream) override;

  void pin_host(void* ptr, std::size_t bytes) override;
  void unpin_host(void* ptr) override;
  bool is_pinned(const void* ptr) const override;
  void* device_pointer_of_host(void* host_ptr) override;

  void launch_host(Stream stream, std::function<void()> fn) override;

  // Makes this device current on the calling thread for a scope, restoring the previous one.
  class Current {
   public:
    explicit Current(int ordinal);
    ~Current();

   private:
    int previous_ = -1;
  };

 private:
  struct Chunk {
    std::size_t bytes = 0;
    std::size_t granularity = 0;  // of its location; host granules may exceed the device's
    Location location;
    bool shareable = false;
    int mappings = 0;        // live mappings of this chunk
    bool destroyed = false;  // released by the user; the driver frees it at the last unmap
  };
  void drop_chunk_if_unused(CUmemGenericAllocationHandle handle);  // lock held
  struct Mapping {
    std::size_t bytes = 0;
    CUmemGenericAllocationHandle handle = 0;
    Location location;
  };
  struct HostCall;  // a launch_host callback in flight
  static void CUDART_CB run_host_call(void* data);

  int attribute(CUdevice_attribute attr) const;  // 0 when the driver cannot say
  std::size_t granularity_for(const Location& location) const;
  cudaStream_t checked_stream(Stream stream) const;  // lock held
  cudaEvent_t checked_event(Event event) const;      // lock held
  void rethrow_host_error(cudaStream_t stream);
  void release_everything() noexcept;
  // Whether [va, va+bytes) lies inside one reservation; lock held.
  bool range_in_reservation(std::uintptr_t va, std::size_t bytes) const;

  int ordinal_;
  CUdevice cu_device_ = 0;
  DeviceProperties props_;
  int least_priority_ = 0, greatest_priority_ = 0;
  bool posix_fd_ = false, rdma_vmm_ = false;

  mutable std::mutex mu_;
  std::unordered_map<void*, std::size_t> allocations_;
  std::map<std::uintptr_t, std::size_t> reservations_;
  std::unordered_map<CUmemGenericAllocationHandle, Chunk> chunks_;
  std::map<std::uintptr_t, Mapping> mappings_;
  std::map<std::uintptr_t, std::size_t> pinned_;
  std::unordered_set<cudaStream_t> streams_, destroyed_streams_;
  std::unordered_set<cudaStream_t> known_streams_;  // others' streams the runtime vouched for
  std::unordered_map<cudaEvent_t, bool> events_;    // value: created with timing
  std::mutex errors_mu_;                            // host callbacks take only this one
  std::unordered_map<cudaStream_t, std::exception_ptr> host_errors_;
  DeviceCounters counters_;
};

}  // namespace stowage::detail
