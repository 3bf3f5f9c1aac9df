#pragma once
// The emulated backend: "device memory" is a capacity-limited region of host memory, streams are
// worker threads keeping a device clock, copy engines can be throttled to a link bandwidth
// (docs/emulated_device.md). Everything is testable without an accelerator.
#include <cstddef>
#include <memory>
#include <string>

#include "stowage/device.hpp"

namespace stowage {

// A throttled link runs between 1 MB/s and 100 TB/s (a rate outside that is a mistake, and its
// copy times would not fit the clock); capacities stop at the 128 TiB a process can address.
inline constexpr double kMinLinkGbps = 1e-3;
inline constexpr double kMaxLinkGbps = 1e5;
inline constexpr std::size_t kMaxEmulatedCapacity = std::size_t{1} << 47;

struct EmulatedOptions {
  std::size_t capacity = std::size_t{8} << 30;     // STOWAGE_EMULATED_CAPACITY
  double link_bandwidth_gbps = 0.0;                // 0 = unthrottled; STOWAGE_EMULATED_LINK_GBPS
  std::size_t granularity = std::size_t{2} << 20;  // VMM granule
  std::string name = "emulated";
  // Streams keep the device's own clock (event times, when queued work may start): the host
  // threads that run them lose time to wake-ups a GPU does not, and up to this much of it per
  // stream is not counted as device time. Copies never beat the link either way.
  double scheduling_slack_ms = 1.0;
};

// Makes an emulated device with the given ordinal.
std::unique_ptr<Device> make_emulated_device(int ordinal, const EmulatedOptions& options = {});

}  // namespace stowage
