#pragma once
// Every argument Megatron-LM's parser accepts (names without "--"), sorted; see the .cpp for the
// source and commit. MindSpeed's own are in mindspeed_arg_names.hpp; the nearest-name search
// covers both.
#include <span>
#include <string>
#include <string_view>

#include "tools/estimate/mindspeed_arg_names.hpp"

namespace stowage::estimate {

std::span<const std::string_view> megatron_argument_names();
// `name` with or without its leading "--".
bool is_megatron_argument(std::string_view name);
// The known argument (Megatron-LM's or MindSpeed's) nearest to `name` by edit distance, with "--"; "" when none is
// within a third of the name's length.
std::string nearest_megatron_argument(std::string_view name);

}  // namespace stowage::estimate
