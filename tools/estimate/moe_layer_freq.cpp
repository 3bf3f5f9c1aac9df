#include "tools/estimate/moe_layer_freq.hpp"

#include <fmt/format.h>

#include <utility>

#include "stowage/error.hpp"
#include "tools/estimate/megatron_arg_values.hpp"

namespace stowage::estimate {
namespace {

// The list expressions Megatron-LM's _eval_pattern hands to Python's eval: integer literals,
// [a, b, …], +, * and parentheses, with Python's precedence and meaning (list + list concatenates,
// list * int and int * list repeat).
class PatternParser {
 public:
  explicit PatternParser(const std::string& text) : s_(text) {}

  std::vector<std::int64_t> list() {
    Value v = expr();
    if (pos_ != s_.size()) fail(fmt::format("unexpected '{}' at position {}", s_[pos_], pos_ + 1));
    if (!v.is_list) fail("it evaluates to an integer, not a list");
    return v.items;
  }

 private:
  // Far beyond any layer count, small enough that no product overflows.
  static constexpr std::int64_t kMax = std::int64_t{1} << 20;
  struct Value {
    bool is_list = false;
    std::int64_t number = 0;
    std::vector<std::int64_t> items;
  };

  [[noreturn]] void fail(const std::string& why) const {
    throw InvalidArgument(fmt::format(
        "megatron-args: --moe-layer-freq '{}': {} (Megatron-LM takes an integer or a list expression of integer "
        "literals, [ ], +, * and parentheses, e.g. \"([0]*3+[1]*29)\")",
        s_, why));
  }
  bool eat(char ch) {
    if (pos_ >= s_.size() || s_[pos_] != ch) return false;
    ++pos_;
    return true;
  }
  Value expr() {
    Value v = term();
    while (eat('+')) {
      Value r = term();
      if (v.is_list != r.is_list) fail("'+' joins a list and an integer");
      if (v.is_list) v.items.insert(v.items.end(), r.items.begin(), r.items.end());
      else v.number += r.number;
      if (std::ssize(v.items) > kMax || v.number > kMax) fail("the pattern is implausibly long");
    }
    return v;
  }
  Value term() {
    Value v = factor();
    while (eat('*')) {
      Value r = factor();
      if (v.is_list && r.is_list) fail("'*' multiplies two lists");
      if (!v.is_list && !r.is_list) {
        if (v.number * r.number > kMax) fail("a product is implausibly large");
        v.number *= r.number;
        continue;
      }
      Value& list = v.is_list ? v : r;
      const std::int64_t times = v.is_list ? r.number : v.number;
      if (std::ssize(list.items) * times > kMax) fail("the pattern is implausibly long");
      std::vector<std::int64_t> out;
      for (std::int64_t i = 0; i < times; ++i) out.insert(out.end(), list.items.begin(), list.items.end());
      v.is_list = true;
      v.items = std::move(out);
    }
    return v;
  }
  Value factor() {
    Value v;
    if (eat('(')) {
      v = expr();
      if (eat(',')) fail("a tuple, not a list");
      if (!eat(')')) fail("a '(' without its ')'");
      return v;
    }
    if (eat('[')) {
      v.is_list = true;
      while (!eat(']')) {
        const Value e = expr();
        if (e.is_list) fail("a list inside the list (entries are 0 or 1)");
        v.items.push_back(e.number);
        if (!eat(',') && !(pos_ < s_.size() && s_[pos_] == ']'))
          fail(pos_ < s_.size() ? fmt::format("expected ',' or ']' at position {}", pos_ + 1)
                                : std::string("a '[' without its ']'"));
      }
      return v;
    }
    const std::size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    if (pos_ == start)
      fail(pos_ < s_.size() ? fmt::format("unexpected '{}' at position {}", s_[pos_], pos_ + 1)
                            : std::string("it ends early"));
    const std::string digits = s_.substr(start, pos_ - start);
    // Python refuses leading zeros in a literal other than 0 itself.
    if (digits.size() > 1 && digits[0] == '0' && digits.find_first_not_of('0') != std::string::npos)
      fail(fmt::format("'{}' is no Python integer literal", digits));
    if (digits.size() > 7) fail("an integer is implausibly large");
    v.number = std::stoll(digits);
    return v;
  }

  const std::string& s_;
  std::size_t pos_ = 0;
};

}  // namespace

std::vector<std::uint8_t> moe_layer_freq_pattern(const std::string& value, std::int64_t num_layers) {
  std::vector<std::uint8_t> pattern;
  if (value.find('[') == std::string::npos) {  // moe_freq_type: int(x)
    const std::int64_t n = to_int("--moe-layer-freq", value);
    if (n <= 0) throw InvalidArgument(fmt::format("megatron-args: --moe-layer-freq must be positive, got {}", n));
    for (std::int64_t i = 0; i < num_layers; ++i) pattern.push_back(i % n == 0 ? 1 : 0);
    return pattern;
  }
  for (std::int64_t v : PatternParser(value).list()) {
    if (v != 0 && v != 1)  // get_gpt_decoder_layer_specs raises for other entries
      throw InvalidArgument(
          fmt::format("megatron-args: --moe-layer-freq '{}': entry {} is neither 0 (dense) nor 1 (MoE)", value, v));
    pattern.push_back(static_cast<std::uint8_t>(v));
  }
  if (std::ssize(pattern) != num_layers)
    throw InvalidArgument(fmt::format(
        "megatron-args: --moe-layer-freq '{}' has {} entries for --num-layers {} (Megatron-LM asserts they match)",
        value, pattern.size(), num_layers));
  return pattern;
}

std::string moe_layer_freq_argument(const std::vector<std::uint8_t>& pattern) {
  const auto n = static_cast<std::int64_t>(pattern.size());
  for (std::int64_t freq = 2; freq <= n; ++freq) {
    bool every = true;
    for (std::int64_t i = 0; i < n && every; ++i) every = pattern[std::size_t(i)] == (i % freq == 0 ? 1 : 0);
    if (every) return fmt::format("{}", freq);
  }
  std::string runs;
  for (std::int64_t i = 0; i < n;) {
    std::int64_t j = i;
    while (j < n && pattern[std::size_t(j)] == pattern[std::size_t(i)]) ++j;
    runs += fmt::format("{}[{}]{}", runs.empty() ? "" : "+", int(pattern[std::size_t(i)]),
                        j - i > 1 ? fmt::format("*{}", j - i) : "");
    i = j;
  }
  return fmt::format("'({})'", runs);
}

}  // namespace stowage::estimate
