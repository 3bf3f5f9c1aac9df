#pragma once
// Host NUMA topology as stowage sees it: where to place pinned host memory for a device.
#include <vector>

#include "stowage/device.hpp"

namespace stowage {

// The host NUMA node(s) nearest a device: by PCI bus id for CUDA, the creating thread's node(s)
// for an emulated device. Empty when the topology is unknown.
std::vector<int> nearest_numa_nodes(const Device& device);

// NUMA nodes the calling thread is bound to (or runs on when unbound).
std::vector<int> current_thread_numa_nodes();

// Number of host NUMA nodes (at least 1).
int numa_node_count();

}  // namespace stowage
