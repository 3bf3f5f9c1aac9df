#include "tools/demo/fit_check.hpp"

#include <fmt/format.h>

#include <climits>
#include <cstdio>
#include <cstring>

#include "offload/host_memory.hpp"
#include "stowage/byte_size.hpp"
#include "stowage/error.hpp"

namespace stowage::demo {

FitFloor fit_floor(const ModelShape& s) {
  const double h = s.hidden, v = s.vocab, layers = s.layers, tokens = static_cast<double>(s.batch) * s.seq;
  // make_layout: embedding and output head (v·h each), per layer two norm gains (h), QKV (3h²),
  // output projection (h²) and an MLP of 4h (2·4h²), and the final norm.
  FitFloor f;
  f.parameters = 2 * v * h + layers * (2 * h + 4 * h * h + 8 * h * h) + h;
  f.device_bytes = 8 * f.parameters + 4 * layers * tokens * h;
  f.host_bytes = 4 * f.parameters;
  return f;
}

double host_available_bytes() { return static_cast<double>(offload::host_memory_available()); }

namespace {

std::string bytes(double b) {
  return b >= 0x1p63 ? fmt::format("{:.3g} bytes", b) : format_bytes(static_cast<std::uint64_t>(b));
}

std::string shape_text(const ModelShape& s) {
  return fmt::format("--layers {} --hidden {} --heads {} --seq {} --batch {}", s.layers, s.hidden, s.heads, s.seq,
                     s.batch);
}

}  // namespace

void check_fits(const ModelShape& s, const Device& device) {
  // The kernels index a layer's activations (tokens × 4·hidden) and a row of attention scores
  // per head with int.
  const double tokens = static_cast<double>(s.batch) * s.seq;
  if (tokens * 4.0 * s.hidden > INT_MAX || static_cast<double>(s.batch) * s.heads * s.seq * s.seq > INT_MAX)
    throw InvalidArgument(
        fmt::format("demo: {} is too large for the demo's kernels (a layer's activations or "
                    "attention scores would exceed 2^31 elements)",
                    shape_text(s)));
  const FitFloor f = fit_floor(s);
  const double capacity = static_cast<double>(device.capacity());
  if (f.device_bytes > capacity)
    throw InvalidArgument(fmt::format(
        "demo: the model does not fit: {} has {:.4g} parameters; every configuration keeps at least the fp32 "
        "weights and their gradients (8 B/parameter) and one fp32 input per layer on the device: {} or more, and "
        "the device has {} (STOWAGE_EMULATED_CAPACITY sets an emulated device's)",
        shape_text(s), f.parameters, bytes(f.device_bytes), bytes(capacity)));
  const double host = host_available_bytes();
  if (f.host_bytes > host)
    throw InvalidArgument(
        fmt::format("demo: the model does not fit the host: {} needs {} of fp32 initial "
                    "parameters, and {} is available",
                    shape_text(s), bytes(f.host_bytes), bytes(host)));
}

}  // namespace stowage::demo
