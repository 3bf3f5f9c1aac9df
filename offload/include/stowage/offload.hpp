#pragma once
// Virtual-memory optimizer offload: Adam's m and v live in host memory that device kernels
// address directly (mapped), or in pinned host memory streamed through small device windows
// (streamed: the H2D of the next chunk, the update of this one and the D2H of the last overlap),
// within a device budget. The fused optimizers run unchanged on the same TensorView type, so
// parameters are bit-identical to device-resident states.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stowage/bucket_optimizers.hpp"
#include "stowage/host_pool.hpp"
#include "stowage/memory_resource.hpp"
#include "stowage/optimizers.hpp"
#include "stowage/parameter_bucket.hpp"
#include "stowage/tensor.hpp"

namespace stowage {

enum class StatePlacement { device, mapped, streamed };
const char* to_string(StatePlacement p);

struct OffloadOptions {
  // Where chunks that do not fit the device budget live: mapped or streamed (device = none
  // offloaded, the budget is ignored).
  StatePlacement host_mode = StatePlacement::mapped;
  // Device bytes the states may take, streamed windows included (docs/offload.md: policy).
  std::size_t device_budget_bytes = 0;
  // Placement unit and streamed window, in elements (a positive multiple of 64). Streaming
  // takes three windows of chunk_elements × 8 B from the budget.
  std::size_t chunk_elements = std::size_t{1} << 20;
};

struct OffloadReport {
  std::size_t state_bytes = 0;         // m + v of every element (8 B each)
  std::size_t device_bytes = 0;        // device-resident chunks + streamed windows
  std::size_t host_bytes = 0;          // chunks in host memory (mapped granules or pool buffers)
  std::size_t device_bytes_saved = 0;  // state_bytes - device_bytes
  std::size_t chunks_on_device = 0, chunks_mapped = 0, chunks_streamed = 0;
  // How mapped chunks reach the device: "vmm-host-numa" (driver virtual memory with a host NUMA
  // location), "mapped-pinned" (pinned host memory with a device address), or "" when none.
  std::string mapping;
  int numa_node = -1;  // the node host chunks are bound to (-1: unbound)
  // Device time of the most recent finished step (events on its stream); -1 before the first.
  // Compare with a device-resident run for the overhead (bench/offload_optimizer_tool).
  double last_step_ms = -1;
  std::int64_t steps = 0;
};

// Adam's states for `numel` weights, split into chunks placed by OffloadOptions.
class OffloadedAdam {
 public:
  // Zero states placed as `options` say. Throws (nothing kept) when the memory cannot be had.
  // The pool must outlive the optimizer, whatever the placement (replace() may move chunks into
  // it): destroying it first ends the process with a message naming both (HostPool::attach).
  OffloadedAdam(ResourceHandle allocator, HostPool& pool, std::size_t numel, OffloadOptions options);
  ~OffloadedAdam();
  OffloadedAdam(const OffloadedAdam&) = delete;
  OffloadedAdam& operator=(const OffloadedAdam&) = delete;

  // Moves chunks to the placement new options give, contents kept. A failure to allocate, map or
  // pin throws the device's error; each chunk is then where it was, or fully moved, never lost.
  void replace(OffloadOptions options);

  // One AdamW/Adam step on the weights' stream, with the device's kernels: split-storage weights,
  // or plain fp32 weights (a contiguous f32 tensor; the same update).
  // grad: contiguous f32 or bf16 of numel elements on the same device.
  StepResult step(ParameterBucket& weights, const TensorView& grad, const AdamOptions& options,
                  const GradScaling& scaling, OptimizerState& state);
  StepResult step(const TensorView& fp32_weights, const TensorView& grad, const AdamOptions& options,
                  const GradScaling& scaling, OptimizerState& state);

  std::size_t numel() const;
  std::size_t chunk_count() const;
  StatePlacement placement(std::size_t chunk) const;
  // Host address of chunk i's m (host chunks) for NUMA checks; nullptr for device chunks.
  const void* host_address(std::size_t chunk) const;
  OffloadReport report() const;
  // Copies of m and v (numel floats each), after every queued step has finished.
  void read_states(float* m, float* v);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace stowage
