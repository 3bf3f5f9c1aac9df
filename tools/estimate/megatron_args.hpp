#pragma once
// Megatron-LM (and MindSpeed) launch arguments, pasted as a user runs them, applied to a
// RunConfig. Every argument is one of: modelled (applied), known to Megatron and without effect
// on a training step's memory (accepted), known and changing memory in a way the model does not
// represent (accepted with a warning in config.warnings), or unknown (an error naming the
// nearest known argument, unless the caller opts into ignoring unknown arguments).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tools/estimate/run_config.hpp"

namespace stowage::estimate {

// Splits shell-style text: whitespace separates, single/double quotes group, backslash-newline
// continues. ParseError for an unterminated quote.
std::vector<std::string> split_arguments(const std::string& text);

enum class UnknownArguments { error, ignore };

struct MegatronArgsReport {
  std::vector<std::string> modelled;    // applied to the configuration
  std::vector<std::string> no_effect;   // Megatron arguments that do not change the memory model's inputs
  std::vector<std::string> unmodelled;  // change memory, not represented (also in config.warnings)
  std::vector<std::string> unknown;     // not Megatron arguments, skipped (UnknownArguments::ignore)
};

// Applies the arguments on top of `config` (the model fields start from it, so a preset can be
// refined). InvalidArgument naming the argument for a missing or malformed value, an empty
// text, or an unknown argument (with the nearest known spelling) under UnknownArguments::error.
MegatronArgsReport apply_megatron_args(const std::string& text, RunConfig& config,
                                       UnknownArguments unknown = UnknownArguments::error);

}  // namespace stowage::estimate
