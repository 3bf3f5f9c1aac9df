#pragma once
// How much host memory a process can still fault in without the kernel's OOM killer stepping
// in: the host pool checks a fresh chunk against it before touching its pages.
#include <cstddef>

namespace stowage::offload {

// MemAvailable (/proc/meminfo; physical memory where the kernel lacks it), lowered to what the
// process's memory cgroup has left below its limit (cgroup v2 memory.max, or v1's limit).
std::size_t host_memory_available();

}  // namespace stowage::offload
