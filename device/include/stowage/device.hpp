#pragma once
// The device layer: one interface, implemented by each backend (device/emulated/, device/cuda/;
// stowage/backends.hpp lists them). Everything above it (allocator, techniques) speaks only this.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stowage/dependents.hpp"
#include "stowage/error.hpp"

namespace stowage {

enum class DeviceKind { emulated, cuda };
const char* to_string(DeviceKind kind);

// Opaque handles. For CUDA a Stream's value is the cudaStream_t (0 = the legacy default
// stream), so streams from a framework can be passed straight through; for the emulated
// backend it is an id the device hands out. Event likewise.
enum class Stream : std::uintptr_t {};
enum class Event : std::uintptr_t {};
inline constexpr Stream kDefaultStream{0};

inline void* native(Stream s) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(s)); }
inline Stream stream_from_native(void* p) { return Stream{reinterpret_cast<std::uintptr_t>(p)}; }

enum class CopyKind { host_to_device, device_to_host, device_to_device, host_to_host };
const char* to_string(CopyKind kind);

// Where a physical chunk of memory lives.
struct Location {
  enum class Kind { device, host, host_numa } kind = Kind::device;
  int numa_node = -1;  // for host_numa
  static Location device() { return {}; }
  static Location host() { return {Kind::host, -1}; }
  static Location host_numa(int node) { return {Kind::host_numa, node}; }
};

// A physical memory chunk made by create_physical(); mapped into reserved ranges.
enum class PhysicalHandle : std::uintptr_t {};

struct PhysicalOptions {
  Location location = Location::device();
  // Ask for a shareable OS handle (POSIX fd) so communication libraries can export/register
  // the memory, and for RDMA-capable memory where the driver supports it.
  bool shareable = true;
  bool rdma_capable = true;
};

struct DeviceProperties {
  DeviceKind kind = DeviceKind::emulated;
  int ordinal = 0;
  std::string name;
  std::size_t capacity = 0;       // bytes of device memory
  std::size_t granularity = 0;    // virtual-memory mapping granule (0 = no VMM)
  bool virtual_memory = false;    // reserve/map/unmap supported
  bool partial_mapping = false;   // map() of part of a chunk (an offset, or less than its size);
                                  // the CUDA driver maps chunks whole
  bool host_numa_memory = false;  // create_physical(Location::host_numa) supported
  bool host_accessible = false;   // the host can read/write device pointers directly
  // How DLPack names this device's memory (a DLDeviceType: 1 = kDLCPU for memory the host
  // addresses as its own, 2 = kDLCUDA, ...): what other frameworks see in stowage's exports.
  int dlpack_device_type = 1;
  std::string pci_bus_id;       // "0000:17:00.0" (CUDA), empty when emulated
  std::vector<int> numa_nodes;  // the host NUMA node(s) nearest this device
};

// Statistics the device keeps of itself (not the allocator's).
struct DeviceCounters {
  std::size_t raw_allocated = 0;       // bytes handed out by allocate()
  std::size_t physical_allocated = 0;  // bytes of device-located physical chunks
  std::size_t reserved_address = 0;    // bytes of reserved virtual address space
  std::size_t pinned_host = 0;         // bytes of host memory registered with pin_host
  std::uint64_t bytes_h2d = 0, bytes_d2h = 0, bytes_d2d = 0;
};

class Device {
 public:
  virtual ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual const DeviceProperties& properties() const = 0;
  DeviceKind kind() const { return properties().kind; }
  int ordinal() const { return properties().ordinal; }
  const std::string& name() const { return properties().name; }
  std::size_t capacity() const { return properties().capacity; }
  virtual std::size_t free_memory() const = 0;
  virtual DeviceCounters counters() const = 0;

  // Raw device memory (cudaMalloc-like: slow path, device-synchronising on CUDA).
  virtual void* allocate(std::size_t bytes) = 0;  // OutOfMemory when it does not fit
  virtual void deallocate(void* ptr) = 0;         // InvalidArgument for a foreign pointer

  // Virtual memory. Sizes and addresses are multiples of properties().granularity.
  virtual void* reserve(std::size_t bytes) = 0;
  virtual void unreserve(void* base, std::size_t bytes) = 0;
  virtual PhysicalHandle create_physical(std::size_t bytes, const PhysicalOptions& options = {}) = 0;
  virtual void destroy_physical(PhysicalHandle handle) = 0;
  // Part of a chunk (offset > 0 or bytes < its size) only where properties().partial_mapping.
  virtual void map(void* va, std::size_t bytes, PhysicalHandle handle, std::size_t offset = 0) = 0;
  virtual void unmap(void* va, std::size_t bytes) = 0;
  // Makes a mapped range readable and writable by this device (and the host where possible).
  virtual void set_access(void* va, std::size_t bytes) = 0;
  // An OS file descriptor for a shareable physical chunk (-1 when not shareable); caller closes.
  virtual int export_handle(PhysicalHandle handle) = 0;

  // Streams. Priorities count as CUDA counts them: lower numbers run first;
  // priority_range() gives {least, greatest} (e.g. {0, -5}); out-of-range values are clamped.
  virtual Stream create_stream(int priority = 0) = 0;
  // Returns once the work queued on `stream` has finished (the stream stays valid until then),
  // so memory used on it can be reused anywhere without waiting on it; then counts one more in
  // stream_epoch(). (CUDA's cudaStreamDestroy alone returns at once and lets the work finish.)
  virtual void destroy_stream(Stream stream) = 0;
  // InvalidArgument when `stream` is not one work can be queued on: never created here, or
  // destroyed. The default stream is always valid. (CUDA: also the legacy and per-thread default
  // streams, and streams a framework created, which the driver is asked about.)
  virtual void check_stream(Stream stream) = 0;
  virtual std::pair<int, int> priority_range() const = 0;
  // How many streams have been destroyed through this device: a cheap way to learn that a
  // stream seen earlier may be gone (the allocator's threads' caches). Streams a framework
  // destroys itself, not through destroy_stream, are not counted.
  std::uint64_t stream_epoch() const noexcept { return epoch_->load(std::memory_order_relaxed); }
  virtual void synchronize(Stream stream) = 0;
  virtual void synchronize() = 0;  // the whole device

  // Events: sequence points in a stream.
  virtual Event create_event(bool timing = false) = 0;
  virtual void destroy_event(Event event) = 0;
  virtual void record(Event event, Stream stream) = 0;
  virtual void wait(Stream stream, Event event) = 0;  // device-side: the host does not block
  virtual bool query(Event event) = 0;                // completed (or never recorded)
  virtual void synchronize(Event event) = 0;
  virtual float elapsed_ms(Event start, Event end) = 0;

  // Copies and fills, ordered on the stream.
  virtual void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream stream) = 0;
  virtual void fill_async(void* dst, std::uint8_t value, std::size_t bytes, Stream stream) = 0;

  // Page-locks host memory for fast, asynchronous copies (cudaHostRegister).
  virtual void pin_host(void* ptr, std::size_t bytes) = 0;
  virtual void unpin_host(void* ptr) = 0;
  virtual bool is_pinned(const void* ptr) const = 0;
  // The device-side address of pinned host memory (mapped pinned memory), or nullptr.
  virtual void* device_pointer_of_host(void* host_ptr) = 0;

  // Runs fn on the host when the stream reaches this point; on the emulated backend this is
  // also how CPU "kernels" run. An exception thrown by fn is rethrown by synchronize(stream).
  // fn must not call a caching allocator (allocate, free, empty_cache, ...) nor synchronize:
  // the allocator synchronizes the device while holding its lock (empty_cache, the retry after a
  // refused growth, the gc threshold), so fn waiting for that lock deadlocks with it. PyTorch's
  // allocator has the same restriction; CUDA forbids CUDA calls in fn (cudaLaunchHostFunc).
  virtual void launch_host(Stream stream, std::function<void()> fn) = 0;

  // Lifetimes: registers an object that keeps this device's memory, streams or events for its
  // whole life (allocators, host pools, OwnedStream and OwnedEvent do; an object of yours may
  // too). The device must outlive it: destroying the device while one is registered ends the
  // process with a message naming both (stowage/dependents.hpp). `what` names the dependent.
  Dependency attach(std::string what);

 protected:
  Device() = default;
  // A backend's destructor calls this first, so the message comes before anything is torn down.
  void check_no_dependents() const noexcept { dependents_.check_none_left(); }
  // A backend's destroy_stream calls this after the stream is gone (and its work finished).
  void count_destroyed_stream() noexcept { own_epoch_.fetch_add(1, std::memory_order_release); }
  // An adaptor over another device reports that device's count (its streams are the inner's).
  void share_stream_epoch(const Device& inner) noexcept { epoch_ = inner.epoch_; }

 private:
  std::atomic<std::uint64_t> own_epoch_{0};
  const std::atomic<std::uint64_t>* epoch_ = &own_epoch_;
  Dependents dependents_;
};

}  // namespace stowage
