#pragma once
// The process-wide devices that stowage's drop-in library (the C ABI) and the `stowage` command
// use: CUDA devices when a GPU is found and STOWAGE_DEVICE is not "emulated", else emulated ones
// (STOWAGE_EMULATED_DEVICES of them). Each is opened on first use and lives until the process ends.
#include "stowage/device.hpp"

namespace stowage {

Device& device(int ordinal);
int device_count();
bool using_cuda();

}  // namespace stowage
