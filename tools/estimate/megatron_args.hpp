#pragma once
// Megatron-LM (and MindSpeed) launch arguments, pasted as a user runs them, applied to a
// RunConfig. Arguments the estimate does not use are ignored and listed in config.notes.
#include <string>
#include <vector>

#include "tools/estimate/run_config.hpp"

namespace stowage::estimate {

// Splits shell-style text: whitespace separates, single/double quotes group, backslash-newline
// continues. ParseError for an unterminated quote.
std::vector<std::string> split_arguments(const std::string& text);

// Applies the arguments on top of `config` (the model fields start from it, so a preset can be
// refined). InvalidArgument naming the argument for a missing or malformed value.
// Returns the arguments that were ignored.
std::vector<std::string> apply_megatron_args(const std::string& text, RunConfig& config);

}  // namespace stowage::estimate
