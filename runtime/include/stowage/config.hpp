#pragma once
// stowage's process-wide configuration: typed options, read from STOWAGE_* environment
// variables in this one place (docs/configuration.md lists them).
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/byte_size.hpp"
#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/fault_injection.hpp"
#include "stowage/log_level.hpp"

namespace stowage {

struct Config {
  LogLevel log_level = LogLevel::off;  // STOWAGE_LOG_LEVEL
  // STOWAGE_DEVICE: which backend the process-wide devices come from: "auto" (the first
  // accelerator backend that has a device, else emulated) or a backend's name (backends.hpp).
  std::string device = "auto";
  int emulated_devices = 1;    // STOWAGE_EMULATED_DEVICES
  EmulatedOptions emulated;    // STOWAGE_EMULATED_CAPACITY, _LINK_GBPS
  AllocatorOptions allocator;  // STOWAGE_ALLOC_CONF
  std::string event_log;       // STOWAGE_EVENT_LOG: CSV path, empty = off
  // STOWAGE_FAULTS: "alloc=N,map=N,pin=N,copy=N"; any non-zero wraps every registry device in
  // a FaultInjectingDevice (testing error paths of a whole program; off by default).
  FaultPlan faults;
  // What was accepted but not used as written (e.g. PyTorch-only STOWAGE_ALLOC_CONF keys).
  // config() writes each to stderr once, even with logging off.
  std::vector<std::string> warnings;
};

// Looks a variable up; nullptr when unset. The default reads the process environment.
using EnvLookup = std::function<const char*(const char*)>;

// Parses every STOWAGE_* variable. ParseError naming the variable for a malformed value.
Config load_config(const EnvLookup& lookup);
Config load_config_from_environment();

// For each STOWAGE_* name that is not one stowage reads: a warning naming it and the closest
// known name. config() writes these to stderr once, on first use.
std::vector<std::string> unknown_variable_warnings(const std::vector<std::string>& names);

// The process's configuration, read from the environment once on first use. A malformed
// variable throws ParseError on every call (nothing is half-configured).
const Config& config();

}  // namespace stowage
