#pragma once
// The process-wide devices that stowage's drop-in library (the C ABI) and the `stowage` command
// use: those of the backend STOWAGE_DEVICE names, or with "auto" (the default) of the first
// accelerator backend that has a device (CUDA), else emulated ones (STOWAGE_EMULATED_DEVICES of
// them). Each is opened on first use and lives until the process ends.
#include "stowage/device.hpp"

namespace stowage {

Device& device(int ordinal);
int device_count();
DeviceKind device_kind();  // the backend the devices come from
bool using_cuda();         // device_kind() == DeviceKind::cuda

}  // namespace stowage
