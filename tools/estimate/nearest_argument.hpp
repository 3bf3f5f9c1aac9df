#pragma once
// The suggestion for a misspelt launch argument, from every name the estimate knows: Megatron-LM's
// (megatron_arg_names.hpp) and MindSpeed's own (mindspeed_arg_names.hpp).
#include <string>
#include <string_view>

namespace stowage::estimate {

// The known argument nearest to `name` (with or without "--") by edit distance, with "--"; "" when
// none is within a third of the name's length. A tie goes to Megatron-LM's.
std::string nearest_launch_argument(std::string_view name);

}  // namespace stowage::estimate
