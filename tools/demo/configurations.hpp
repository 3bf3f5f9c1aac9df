#pragma once
// The demo's configurations: which technique replaces which baseline hook.
#include <string>
#include <vector>

#include "stowage/precision.hpp"

namespace stowage::demo {

struct Techniques {
  bool shared_storage = false;     // bf16 plane inside the fp32 master (stowage/precision.hpp)
  bool recompute = false;          // release the GeLU output after forward, recompute before backward
  bool swap_attention = false;     // attention activations to host after forward, prefetched for backward
  bool offload_optimizer = false;  // AdamW m, v in host memory
};

struct Configuration {
  std::string name;
  Techniques techniques;
  std::string summary;  // one line for the table
};

// Every configuration this build offers, in display order: baseline first, "all" last.
const std::vector<Configuration>& all_configurations();
// The named ones, in the order given ("all" expands to nothing but itself). InvalidArgument
// naming the unknown name and listing the known ones.
std::vector<Configuration> select_configurations(const std::string& comma_separated);
// Names of techniques the issue asks for that this build does not offer yet, with why.
std::vector<std::string> missing_techniques();

}  // namespace stowage::demo
