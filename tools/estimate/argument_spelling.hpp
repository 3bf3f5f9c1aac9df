#pragma once
// How a launch argument's name is written: the name tables (megatron_arg_names.hpp,
// mindspeed_arg_names.hpp) hold it without the leading "--" that a command line has.
#include <string_view>

namespace stowage::estimate {

inline std::string_view without_dashes(std::string_view name) { return name.substr(name.rfind("--", 0) == 0 ? 2 : 0); }

}  // namespace stowage::estimate
