#pragma once
// The machines a plan runs on: GPUs and their memory, links and peak compute. Defaults are a
// DGX H100 (NVIDIA H100 SXM datasheet: 80 GB HBM3 at 3.35 TB/s, 989 TFLOP/s dense BF16,
// NVLink 900 GB/s both directions, PCIe Gen5 x16 128 GB/s both directions; one 400 Gb/s
// ConnectX-7 NIC per GPU; DGX H100 user guide: 2 TB host memory per node).
#include <cstdint>

namespace stowage::plan {

struct Cluster {
  std::int64_t gpus = 8;
  std::int64_t gpus_per_node = 8;
  std::int64_t gpu_memory = std::int64_t{80} << 30;
  std::int64_t host_memory_per_node = std::int64_t{2} << 40;
  double intra_node_gbps = 450;  // GB/s one direction, per GPU (NVLink)
  double inter_node_gbps = 50;   // GB/s one direction, per GPU (400 Gb/s NIC)
  double host_link_gbps = 64;    // GB/s one direction, per GPU (PCIe Gen5 x16)
  double hbm_gbps = 3350;        // GB/s
  double peak_tflops = 989;      // dense 16-bit tensor-core peak, TFLOP/s
  // Fraction of peak the matrix multiplications reach: the time model's one calibration knob
  // (docs/plan.md compares it with published throughput).
  double efficiency = 0.6;
};

// InvalidArgument naming the field for sizes that are zero or negative, GPUs that do not fill
// whole nodes, and efficiencies outside (0, 1].
void validate(const Cluster& c);

}  // namespace stowage::plan
