#pragma once
// A reader for the part of Python's pickle format that PyTorch's memory snapshots use
// (torch.cuda.memory._dump_snapshot): dicts, lists, tuples, strings, integers, floats, booleans
// and None, with the memo, in binary protocols 2 to 5. An opcode that would construct a Python
// object (GLOBAL, REDUCE, BUILD, ...) is refused by name and offset: nothing is executed.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace stowage::inspect {

// Which items to keep of the lists stored under one dict key, decided before they are expanded:
// a pickle may share one list (through the memo) among many dicts, and expanding every reference
// in full can cost far more than the file. `select` is called once per distinct list with its
// item count and a way to look at item i, and returns the indices to keep, in the order wanted;
// every reference to that list then reads as the kept items. Lists elsewhere expand in full.
struct ListSelector {
  std::string key;
  std::function<std::vector<std::size_t>(std::size_t count,
                                         const std::function<const nlohmann::json&(std::size_t)>& item)>
      select;
};

// Tuples become arrays; dict keys must be strings or integers (written as decimal strings).
// ParseError("<what>: pickle: ... at byte N") for anything else, truncated input, nesting deeper
// than kMaxPickleDepth, more than kMaxPickleValues values, memo entries or items while reading,
// or a result beyond pickle_budget: the guard against memo references that multiply a value.
// Each reference counts in full (a string the memo hands out 1,000 times is 1,000 strings); an
// item a selector looks at counts in full once, then one value a look. Memory while reading: 16
// bytes a value (None, True and False shared; strings stay in `data`), 8 an item of a list or
// dict, 4 a place on the stack, a MARK or a memo id, each bounded by kMaxPickleValues; then the
// result, within pickle_budget.
inline constexpr int kMaxPickleDepth = 64;
inline constexpr std::size_t kMaxPickleValues = std::size_t{1} << 24;
struct PickleBudget {
  std::size_t values;  // JSON values in the result
  std::size_t text;    // bytes of its strings and dict keys
};
// 2^20 values and 64 MiB of text, and for each byte of the file one value more (to at most
// kMaxPickleValues) and 16 bytes of text more. PyTorch's snapshots hold under 0.3 values and
// 2 bytes of text per byte of pickle.
PickleBudget pickle_budget(std::size_t file_bytes);
nlohmann::json read_pickle(std::string_view data, const std::string& what, const ListSelector* selector = nullptr);

// Writes `value` as a protocol-2 pickle that Python's pickle.load reads back: objects become
// dicts, arrays lists; integers as Python's pickle writes them (BININT1, BININT2, BININT, else
// LONG1 with the fewest bytes), which memory_viz's JavaScript unpickler needs: it reads a LONG1
// of more than 8 bytes as a BigInt, which it cannot mix with numbers.
std::string write_pickle(const nlohmann::json& value);

}  // namespace stowage::inspect
