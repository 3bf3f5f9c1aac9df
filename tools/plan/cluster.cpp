#include "tools/plan/cluster.hpp"

#include <cmath>

#include <fmt/format.h>

#include "stowage/error.hpp"

namespace stowage::plan {

void validate(const Cluster& c) {
  auto positive = [](double v, const char* what) {
    if (!(v > 0) || !std::isfinite(v)) throw InvalidArgument(fmt::format("{} must be positive, got {}", what, v));
  };
  positive(double(c.gpus), "--gpus");
  positive(double(c.gpus_per_node), "--gpus-per-node");
  positive(double(c.gpu_memory), "--gpu-memory");
  positive(double(c.host_memory_per_node), "--host-memory");
  positive(c.intra_node_gbps, "--intra-node-bw");
  positive(c.inter_node_gbps, "--inter-node-bw");
  positive(c.host_link_gbps, "--host-link-bw");
  positive(c.hbm_gbps, "--hbm-bw");
  positive(c.peak_tflops, "--peak-tflops");
  if (!(c.efficiency > 0 && c.efficiency <= 1))
    throw InvalidArgument(fmt::format("--efficiency must be in (0, 1], got {}", c.efficiency));
  if (c.gpus > (1 << 20)) throw InvalidArgument(fmt::format("--gpus {} is implausibly large", c.gpus));
  if (c.gpus > c.gpus_per_node && c.gpus % c.gpus_per_node != 0)
    throw InvalidArgument(
        fmt::format("--gpus ({}) must be whole nodes of --gpus-per-node ({})", c.gpus, c.gpus_per_node));
}

}  // namespace stowage::plan
