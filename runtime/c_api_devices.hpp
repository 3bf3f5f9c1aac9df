#pragma once
// The C ABI's process-wide allocators, for entry points beside c_api.cpp that need device memory
// (a flag for a finite check, say).
#include "stowage/memory_resource.hpp"

namespace stowage::capi {

// What `device`'s blocks come from (the caching allocator, or its event-log adaptor); made on
// first use. InvalidArgument for an ordinal that names no device.
[[gnu::visibility("hidden")]] MemoryResource& allocator_of(int device);

}  // namespace stowage::capi
