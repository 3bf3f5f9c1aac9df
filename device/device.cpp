// What every backend shares: the record of the objects made on a device (stowage/dependents.hpp).
#include "stowage/device.hpp"

#include <fmt/format.h>

namespace stowage {

Device::~Device() = default;  // dependents_ ends the process if a dependent is still registered

Dependency Device::attach(std::string what) {
  return dependents_.add(fmt::format("device {} ({})", ordinal(), name()), std::move(what));
}

}  // namespace stowage
