#pragma once
// Storage-release activation recomputation (MindSpeed's activation-function recompute as an
// API). The output of a cheap function between two matmuls (GeLU, SwiGLU, dropout…) is needed
// again only in backward. Register it as y = f(x…) for a layer; after forward, release(layer)
// gives y's device bytes back to the allocator (y keeps shape, dtype and strides; every view of
// it stays valid through the storage handle); before_backward(layer) rematerialises it: new
// bytes, and f run again on the compute stream, stream-ordered, with no host synchronisation.
//
// A registration keeps its inputs alive (it holds their views) until after_backward(layer).
// Random state is a counter-based stream per registration (RecomputeContext::rng), so a
// dropout-like f recomputes the same mask. f must be deterministic given its inputs and rng;
// the kernels of activations.hpp are, so the recomputed y is bit-identical to the forward one.
//
// Release is refused (InvalidArgument, nothing released) when an output's storage
//   - is swapped out (a tensor is either swapped or released, never both), wrapped, or from
//     another allocator;
//   - is also the storage of an input of any live registration (an in-place or aliasing f);
//   - has more handles than the registry accounts for: its own record of each output view plus
//     the one view per output that forward() returned (or forward_into() was given). Any other
//     live view of that storage (a slice, a reshape, a copy of the view kept elsewhere) is an
//     alias someone may read before backward, so the release is refused instead of deferred.
// Functions must therefore not hold output views in queued work: capture pointers, as kernels do;
// and they must not call back into the registry (it runs them under its lock). A call back from
// the function's own thread throws InvalidArgument (and before_backward leaves the outputs
// released, as for any failing function); one from work the function waits for on another
// thread would wait for the lock for ever, so do not.
// The bytes go back stream-ordered on the output's stream (the compute stream): a consumer on
// another stream that may still be reading them needs MemoryResource::record_stream first,
// as with any free.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stowage/counter_rng.hpp"
#include "stowage/device.hpp"
#include "stowage/tensor.hpp"

namespace stowage {

// What a registered function is given, in forward and in every recomputation.
struct RecomputeContext {
  const std::vector<TensorView>& inputs;
  const std::vector<TensorView>& outputs;  // resident; f writes them
  Device& device;
  Stream stream;     // launch everything on this stream
  RngState rng;      // the same every time
  bool recomputing;  // false in forward()
};
using RecomputeFn = std::function<void(const RecomputeContext&)>;

struct OutputSpec {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
};

struct RecomputeOptions {
  Stream compute_stream = kDefaultStream;  // forward, recomputation and backward run here
  // before_backward(L) also rematerialises layers L-1 … L-distance (backward visits layers in
  // descending order), so their recompute is queued ahead of time. A prefetched layer whose
  // inputs are not resident yet, or that finds no memory, is left for its own before_backward.
  int prefetch_distance = 0;
  std::uint64_t seed = 0;  // the generator's key
};

struct RecomputeStats {
  std::uint64_t releases = 0;            // storages released
  std::uint64_t rematerializations = 0;  // storages brought back and recomputed
  std::uint64_t bytes_released = 0;      // totals over the registry's life
  std::uint64_t bytes_recomputed = 0;
  std::size_t released_bytes_now = 0;     // device bytes currently given back
  std::uint64_t prefetches_deferred = 0;  // prefetched layers left for their own hook
};

// One released (or releasable) output, for tools: the tag snapshots show when it is resident.
struct RecomputeEntry {
  int layer = 0;
  std::string tag;  // "layer<L>.<name>"
  std::size_t nbytes = 0;
  StorageState state = StorageState::resident;
};

class Recompute {
 public:
  // InvalidArgument for a negative prefetch distance.
  // Outputs come from `resource` (the caching allocator, or an adaptor over it).
  explicit Recompute(ResourceHandle resource, RecomputeOptions options = {});
  ~Recompute();
  Recompute(const Recompute&) = delete;
  Recompute& operator=(const Recompute&) = delete;

  // Allocates the outputs on the compute stream, tagged "layer<L>.<name>", runs f, registers
  // y = f(x…) for the layer and returns the outputs. If f throws, nothing is registered.
  std::vector<TensorView> forward(int layer, const std::string& name, std::vector<TensorView> inputs,
                                  const std::vector<OutputSpec>& outputs, RecomputeFn fn);
  // The same with outputs the caller made (resident, from this registry's allocator, not yet
  // registered as another function's output).
  void forward_into(int layer, const std::string& name, std::vector<TensorView> inputs, std::vector<TensorView> outputs,
                    RecomputeFn fn);

  // Releases every output registered for the layer (all or none; see the rules above). Returns
  // the bytes given back; 0 for a layer with nothing registered or already released.
  std::size_t release(int layer);
  // Rematerialises the layer's released outputs on the compute stream (and prefetches, per
  // options). InvalidArgument when an input of the layer is not resident (released or swapped
  // out: bring it back first); OutOfMemory from the allocator. Either way nothing changes.
  // An exception from a function (e.g. a DeviceError from its kernels) propagates and leaves
  // the outputs it did not finish released, so a later call recomputes them.
  void before_backward(int layer);
  // Forgets the layer's registrations: its inputs are no longer kept alive by the registry.
  void after_backward(int layer);

  bool released(int layer) const;  // true when any output of the layer is released
  std::vector<RecomputeEntry> entries() const;
  RecomputeStats stats() const;
  const RecomputeOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stowage
