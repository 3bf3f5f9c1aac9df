#pragma once
// Host NUMA topology through hwloc: which NUMA nodes sit nearest a PCI device or the calling
// thread. Backends fill DeviceProperties::numa_nodes from here; the host pool binds there.
#include <string>
#include <vector>

namespace stowage::detail {

// NUMA nodes nearest the PCI device "dddd:bb:dd.f" (the nodeset of its first non-I/O
// ancestor); empty when hwloc does not know the device.
std::vector<int> numa_nodes_near_pci(const std::string& pci_bus_id);

// NUMA nodes the calling thread is bound to; when it is not bound (its binding spans every
// node), the node of the CPU it runs on now. Empty when hwloc cannot tell.
std::vector<int> current_thread_numa_nodes();

// Number of host NUMA nodes (at least 1).
int numa_node_count();

}  // namespace stowage::detail
