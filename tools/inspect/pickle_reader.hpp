#pragma once
// A reader for the part of Python's pickle format that PyTorch's memory snapshots use
// (torch.cuda.memory._dump_snapshot): dicts, lists, tuples, strings, integers, floats, booleans
// and None, with the memo, in binary protocols 2 to 5. An opcode that would construct a Python
// object (GLOBAL, REDUCE, BUILD, ...) is refused by name and offset: nothing is executed.
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace stowage::inspect {

// Tuples become arrays; dict keys must be strings or integers (written as decimal strings).
// ParseError("<what>: pickle: ... at byte N") for anything else, truncated input, nesting deeper
// than kMaxPickleDepth, or a value that would expand (through shared memo references) beyond
// kMaxPickleValues values.
inline constexpr int kMaxPickleDepth = 64;
inline constexpr std::size_t kMaxPickleValues = std::size_t{1} << 24;
nlohmann::json read_pickle(std::string_view data, const std::string& what);

// Writes `value` as a protocol-2 pickle that Python's pickle.load reads back: objects become
// dicts, arrays lists; integers beyond 32 bits use LONG1.
std::string write_pickle(const nlohmann::json& value);

}  // namespace stowage::inspect
