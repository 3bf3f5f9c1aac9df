#pragma once
// Every argument Megatron-LM's parser accepts (names without "--"), sorted; see the .cpp for the
// source and commit. MindSpeed's own are in mindspeed_arg_names.hpp; nearest_argument.hpp
// searches both.
#include <span>
#include <string_view>

namespace stowage::estimate {

std::span<const std::string_view> megatron_argument_names();
// `name` with or without its leading "--".
bool is_megatron_argument(std::string_view name);

}  // namespace stowage::estimate
