#pragma once
// Values of Megatron-LM launch arguments as its argparse reads them, each refusal an
// InvalidArgument naming the argument and the value.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace stowage::estimate {

// A whole number (argparse type=int).
std::int64_t to_int(const std::string& arg, const std::string& value);
// A size whose 0 would read as "not given" (then Megatron's default would replace it silently).
std::int64_t to_positive(const std::string& arg, const std::string& value);
// A probability in [0, 1] (dropouts).
double to_double(const std::string& arg, const std::string& value);
// An argparse `choices` argument: Megatron-LM refuses any other value (case matters).
std::string one_of(const std::string& arg, const std::string& value, std::initializer_list<std::string_view> choices);

}  // namespace stowage::estimate
