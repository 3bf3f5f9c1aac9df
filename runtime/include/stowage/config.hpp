#pragma once
// stowage's process-wide configuration: typed options, read from STOWAGE_* environment
// variables in this one place (docs/configuration.md lists them).
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "stowage/allocator.hpp"
#include "stowage/byte_size.hpp"
#include "stowage/device.hpp"
#include "stowage/fault_injection.hpp"
#include "stowage/log_level.hpp"

namespace stowage {


// Which devices the process-wide registry (stowage::device) opens.
enum class DeviceChoice { automatic, cuda, emulated };
const char* to_string(DeviceChoice choice);

struct Config {
  LogLevel log_level = LogLevel::off;             // STOWAGE_LOG_LEVEL
  DeviceChoice device = DeviceChoice::automatic;  // STOWAGE_DEVICE: auto | cuda | emulated
  int emulated_devices = 1;                       // STOWAGE_EMULATED_DEVICES
  EmulatedOptions emulated;                       // STOWAGE_EMULATED_CAPACITY, _LINK_GBPS
  AllocatorOptions allocator;                     // STOWAGE_ALLOC_CONF
  std::string event_log;                          // STOWAGE_EVENT_LOG: CSV path, empty = off
  // STOWAGE_FAULTS: "alloc=N,map=N,pin=N,copy=N"; any non-zero wraps every registry device in
  // a FaultInjectingDevice (testing error paths of a whole program; off by default).
  FaultPlan faults;
};

// Looks a variable up; nullptr when unset. The default reads the process environment.
using EnvLookup = std::function<const char*(const char*)>;

// Parses every STOWAGE_* variable. ParseError naming the variable for a malformed value.
Config load_config(const EnvLookup& lookup);
Config load_config_from_environment();

// The process's configuration, read from the environment once on first use. A malformed
// variable throws ParseError on every call (nothing is half-configured).
const Config& config();


}  // namespace stowage
