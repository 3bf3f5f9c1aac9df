#pragma once
// How much host memory a process can still fault in without the kernel's OOM killer stepping
// in: the host pool checks a fresh chunk against it before touching its pages.
#include <cstddef>
#include <optional>

namespace stowage::offload {

// MemAvailable (/proc/meminfo; physical memory where the kernel lacks it), lowered to what the
// process's memory cgroup has left below its limit (cgroup v2 memory.max, or v1's limit).
std::size_t host_memory_available();

// What NUMA node `node` can still give a process bound to it (MPOL_BIND): its free pages and its
// file pages, which the kernel reclaims first (/sys/devices/system/node/nodeN/meminfo); nothing
// when the kernel does not say.
std::optional<std::size_t> node_memory_available(int node);

}  // namespace stowage::offload
