#pragma once
// Whether the process-wide devices were opened in a process this one was forked from. Their
// registry's lock may then be held for ever by a parent's thread, and the devices (and anything
// made on them: allocators, host pools) are the parent's; a child that never inherited them opens
// its own.
#include <string_view>

namespace stowage {

// DeviceError naming `what` and fork() when the devices were opened before a fork() that parted
// this process from them. Cheap: one relaxed load once the registry exists (it is made here
// otherwise, as the child's own).
[[gnu::visibility("hidden")]] void refuse_if_devices_forked(std::string_view what);

}  // namespace stowage
