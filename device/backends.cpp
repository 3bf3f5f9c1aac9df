// The backend table: a new backend is a folder under device/ and one line here.
#include "stowage/backends.hpp"

#include <fmt/format.h>

#include "stowage/cuda_device.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/error.hpp"

namespace stowage {
namespace {

constexpr Backend kBackends[] = {
    {DeviceKind::cuda, "cuda", true, &cuda_device_count, &cuda_unavailable_reason,
     [](int ordinal, const BackendOptions&) { return make_cuda_device(ordinal); }},
    {DeviceKind::emulated, "emulated", false, [] { return 0; },
     [] { return std::string("emulated devices are made on request, not found"); },
     [](int ordinal, const BackendOptions& o) { return make_emulated_device(ordinal, o.emulated); }},
};

}  // namespace

std::span<const Backend> backends() { return kBackends; }

const Backend* find_backend(std::string_view name) {
  for (const Backend& b : kBackends)
    if (name == b.name) return &b;
  return nullptr;
}

const Backend& backend_of(DeviceKind kind) {
  for (const Backend& b : kBackends)
    if (b.kind == kind) return b;
  throw Unsupported(fmt::format("no backend for device kind {}", static_cast<int>(kind)));
}

std::string backend_names() {
  std::string out;
  for (const Backend& b : kBackends) out += (out.empty() ? "" : ", ") + std::string(b.name);
  return out;
}

const char* to_string(DeviceKind kind) {
  for (const Backend& b : kBackends)
    if (b.kind == kind) return b.name;
  return "unknown";
}

}  // namespace stowage
