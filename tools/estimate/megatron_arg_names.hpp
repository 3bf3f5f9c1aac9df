#pragma once
// Every argument Megatron-LM's parser accepts, and MindSpeed's own (names without "--"), each
// sorted; see the .cpp for the sources and commits.
#include <span>
#include <string>
#include <string_view>

namespace stowage::estimate {

std::span<const std::string_view> megatron_argument_names();
// `name` with or without its leading "--".
bool is_megatron_argument(std::string_view name);
// MindSpeed's arguments that Megatron-LM does not have; `name` with or without "--".
bool is_mindspeed_argument(std::string_view name);
// The known argument (Megatron-LM's or MindSpeed's) nearest to `name` by edit distance, with "--"; "" when none is
// within a third of the name's length.
std::string nearest_megatron_argument(std::string_view name);

}  // namespace stowage::estimate
