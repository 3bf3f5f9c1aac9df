#pragma once
// Every argument MindSpeed adds to Megatron-LM's parser (names without "--"), sorted; see the
// .cpp for the source and commit.
#include <span>
#include <string_view>

namespace stowage::estimate {

std::span<const std::string_view> mindspeed_argument_names();
// MindSpeed's arguments that Megatron-LM does not have; `name` with or without "--".
bool is_mindspeed_argument(std::string_view name);

}  // namespace stowage::estimate
