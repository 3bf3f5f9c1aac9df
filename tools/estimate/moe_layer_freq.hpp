#pragma once
// Megatron-LM's --moe-layer-freq: which layers get the experts, read from the launch line and
// written back to one.
#include <cstdint>
#include <string>
#include <vector>

namespace stowage::estimate {

// The pattern for `num_layers` layers, one entry per layer (1 MoE, 0 dense): an integer N makes
// layers 0, N, 2N, … MoE; a list expression ("([0]*3+[1]*29)", "[1,0]*4") is the pattern itself
// (arguments.py moe_freq_type / _eval_pattern, gpt_layer_specs.py). Only integer literals, lists,
// +, * and parentheses are evaluated; InvalidArgument for anything else, for entries other than
// 0 and 1, and for a length other than num_layers.
std::vector<std::uint8_t> moe_layer_freq_pattern(const std::string& value, std::int64_t num_layers);

// The argument for a pattern: N when layers 0, N, 2N, … are the MoE ones, else the pattern as
// runs, "([0]*3+[1]*29)" (quoted: the shell would expand the brackets). It reads back as the same
// pattern.
std::string moe_layer_freq_argument(const std::vector<std::uint8_t>& pattern);

}  // namespace stowage::estimate
