#pragma once
// Swap-attention: activations that are not needed again until backward are copied to pinned
// host memory after forward (device memory goes back to the allocator once the copy is done)
// and brought back before backward, hidden behind compute. The MindSpeed --swap-attention
// technique; TransformerEngine/Megatron CPU offload do the same.
//
// Use: after a layer's forward, offload(view, layer, tag) each candidate tensor. In backward
// (layers visited in descending order) call before_backward(layer) as the layer's backward starts
// and after_backward(layer) when it ends; acquire(view) before the backward uses a tensor. At the
// end of the step, finish_step().
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "stowage/device.hpp"
#include "stowage/tensor.hpp"

namespace stowage {

class CachingAllocator;
class HostPool;

// Which tensors to swap.
struct SwapPolicy {
  // Module tags to swap: a tensor qualifies when its tag equals one of these or has it as a
  // dot-separated part ("attn" matches "layer3.attn"). Empty: every tag.
  std::vector<std::string> tags{"attn"};
  std::size_t min_bytes = std::size_t{512} << 10;  // smaller tensors stay on the device
  std::size_t host_cap_bytes = 0;                  // host bytes swapped tensors may hold (0 = no cap)
};

struct SwapOptions {
  SwapPolicy policy;
  // before_backward(L) prefetches layers L-distance..L (and any later layer not yet fetched).
  // 0: during the same layer's backward (MindSpeed: behind its MLP backward).
  int prefetch_distance = 0;
  Stream compute_stream = kDefaultStream;  // the stream forward and backward kernels run on
  int copy_stream_priority = 0;
};

// What offload() did. Anything but `swapped` leaves the tensor on the device, untouched.
enum class SwapDecision {
  swapped,            // the copy to host is under way (or the storage was swapped already)
  kept_tag,           // its tag is not in the policy
  kept_small,         // smaller than policy.min_bytes
  kept_host_cap,      // policy.host_cap_bytes would be exceeded
  kept_pool_full,     // the host pool refused (its cap, or the system)
  kept_not_resident,  // released for recomputation (a tensor is never both)
  kept_not_ours,      // wrapped storage, or from another memory resource
};
const char* to_string(SwapDecision d);

struct SwapStats {
  std::uint64_t copies_d2h = 0, copies_h2d = 0;
  std::uint64_t bytes_d2h = 0, bytes_h2d = 0;
  std::uint64_t kept_tag = 0, kept_small = 0, kept_host_cap = 0, kept_pool_full = 0;
  std::uint64_t kept_not_resident = 0, kept_not_ours = 0;
  std::uint64_t kept_bytes_host_cap = 0, kept_bytes_pool_full = 0;  // bytes left on the device
  std::uint64_t prefetch_on_demand = 0;                             // acquire() found no prefetch under way
  std::uint64_t prefetch_oom = 0;                   // prefetch put off: no device memory (acquire retries)
  std::size_t host_bytes = 0, peak_host_bytes = 0;  // host bytes held for swapped tensors
  std::size_t tensors_swapped = 0;                  // storages on the host or coming back now
  double d2h_ms = 0, h2d_ms = 0;                    // copy time on the copy streams
  double compute_wait_ms = 0;                       // compute stream stalled in acquire()
  // 1 - compute_wait / (d2h + h2d time): the share of transfer time hidden behind compute.
  double overlap_fraction = 1.0;
};

class SwapScheduler {
 public:
  // InvalidArgument when the pool serves another device or the distance is negative.
  // Device blocks come from `allocator` (the caching allocator, or an adaptor over it). The pool
  // must outlive the scheduler (swapped tensors live in its pages): destroying it first ends the
  // process with a message naming both (HostPool::attach).
  SwapScheduler(ResourceHandle allocator, HostPool& pool, SwapOptions options = {});
  // Brings every tensor still swapped and still referenced back to the device (synchronously).
  ~SwapScheduler();
  SwapScheduler(const SwapScheduler&) = delete;
  SwapScheduler& operator=(const SwapScheduler&) = delete;

  // After `layer`'s forward produced `view` (on the compute stream).
  SwapDecision offload(const TensorView& view, int layer, std::string_view tag);

  // Backward-layer hooks: prefetch per prefetch_distance; return finished buffers.
  void before_backward(int layer);
  void after_backward(int layer);
  // Starts bringing `layer`'s tensors back now.
  void prefetch(int layer);

  // Makes the compute stream wait (device-side) for `view`'s bytes and returns it resident; its
  // data pointer may differ from before the swap. A view that was not swapped comes back as is.
  // OutOfMemory when the device has no room: the tensor then stays safely on the host.
  TensorView acquire(const TensorView& view);

  // Waits for the copy streams, returns every host buffer and device block no one needs, and
  // settles the timing metrics.
  void finish_step();

  SwapStats stats() const;
  void reset_stats();  // counters and times (not what is swapped now)
  const SwapOptions& options() const;
  Stream d2h_stream() const;
  Stream h2d_stream() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stowage
