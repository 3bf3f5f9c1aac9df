#include "tools/inspect/pickle_reader.hpp"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "stowage/error.hpp"

namespace stowage::inspect {

namespace {

// Values live in an arena and are referred to by index, so a memoized dict or list that is
// filled after it was memoized is the same value wherever the memo hands it out.
struct Value {
  enum class Kind { scalar, list, dict } kind = Kind::scalar;
  nlohmann::json scalar;
  std::vector<std::size_t> items;                          // list and tuple
  std::vector<std::pair<std::string, std::size_t>> pairs;  // dict
};

class Reader {
 public:
  Reader(std::string_view data, const std::string& what, const ListSelector* selector)
      : d_(data), what_(what), selector_(selector) {}

  nlohmann::json run() {
    while (true) {
      if (pos_ >= d_.size()) fail("ends before STOP");
      const std::size_t at = pos_;
      const auto op = static_cast<unsigned char>(d_[pos_++]);
      if (!step(op, at)) break;
    }
    if (stack_.size() != 1) fail(fmt::format("STOP with {} values on the stack (one expected)", stack_.size()));
    std::size_t budget = kMaxPickleValues;
    return to_json(stack_.back(), 0, budget);
  }

 private:
  [[noreturn]] void fail(const std::string& why, std::size_t at = std::string::npos) const {
    throw ParseError(fmt::format("{}: pickle: {} at byte {}", what_, why, at == std::string::npos ? pos_ : at));
  }

  std::string_view take(std::size_t n) {
    if (n > d_.size() - pos_) fail(fmt::format("truncated ({} bytes wanted, {} left)", n, d_.size() - pos_));
    const std::string_view s = d_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::uint64_t le(std::size_t n) {  // unsigned little-endian of n <= 8 bytes
    const std::string_view s = take(n);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t(static_cast<unsigned char>(s[i])) << (8 * i);
    return v;
  }

  std::size_t push_value(Value v) {
    if (values_.size() >= kMaxPickleValues) fail("more values than the reader's limit");
    values_.push_back(std::move(v));
    stack_.push_back(values_.size() - 1);
    return values_.size() - 1;
  }
  void push_scalar(nlohmann::json j) { push_value(Value{Value::Kind::scalar, std::move(j), {}, {}}); }
  std::size_t pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back()))
      fail("a value is missing (stack underflow)");
    const std::size_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  std::vector<std::size_t> pop_to_mark() {
    if (marks_.empty()) fail("no MARK for this opcode");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    std::vector<std::size_t> out(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return out;
  }
  Value& top(Value::Kind kind, const char* op) {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back()))
      fail(fmt::format("{} with nothing to add to", op));
    Value& v = values_[stack_.back()];
    if (v.kind != kind)
      fail(fmt::format("{} on a value that is not a {}", op, kind == Value::Kind::dict ? "dict" : "list"));
    return v;
  }
  std::string key_of(std::size_t index) {
    const Value& k = values_[index];
    if (k.kind == Value::Kind::scalar && k.scalar.is_string()) return k.scalar.get<std::string>();
    if (k.kind == Value::Kind::scalar && k.scalar.is_number_integer()) return k.scalar.dump();
    fail("a dict key that is not a string or an integer");
  }
  void set_items(const std::vector<std::size_t>& kv, const char* op) {
    if (kv.size() % 2 != 0) fail(fmt::format("{} with an odd number of keys and values", op));
    top(Value::Kind::dict, op);  // checks there is one
    const std::size_t dict_index = stack_.back();
    for (std::size_t i = 0; i < kv.size(); i += 2) {
      std::string key = key_of(kv[i]);
      values_[dict_index].pairs.emplace_back(std::move(key), kv[i + 1]);
    }
  }
  void memo_put(std::uint64_t id) {
    if (stack_.empty()) fail("memo store with an empty stack");
    memo_[id] = stack_.back();
  }
  void memo_get(std::uint64_t id) {
    const auto it = memo_.find(id);
    if (it == memo_.end()) fail(fmt::format("memo {} was never stored", id));
    stack_.push_back(it->second);
  }
  void push_text(std::size_t n) {
    const std::string_view s = take(n);
    try {
      nlohmann::json j = std::string(s);
      (void)j.dump();  // refuses text that is not UTF-8
      push_scalar(std::move(j));
    } catch (const nlohmann::json::exception&) {
      fail("a string that is not UTF-8");
    }
  }
  void push_long(std::size_t n) {
    if (n == 0) return push_scalar(0);
    if (n > 9) fail(fmt::format("an integer of {} bytes (wider than 64 bits)", n));
    const std::string_view s = take(n);
    const bool negative = (static_cast<unsigned char>(s[n - 1]) & 0x80) != 0;
    if (n == 9) {  // an unsigned 64-bit value has a ninth, zero byte
      if (s[8] != 0) fail("an integer wider than 64 bits");
      std::uint64_t v = 0;
      for (std::size_t i = 0; i < 8; ++i) v |= std::uint64_t(static_cast<unsigned char>(s[i])) << (8 * i);
      return push_scalar(v);
    }
    std::uint64_t v = negative ? ~std::uint64_t{0} : 0;
    for (std::size_t i = 0; i < n; ++i) {
      v &= ~(std::uint64_t{0xff} << (8 * i));
      v |= std::uint64_t(static_cast<unsigned char>(s[i])) << (8 * i);
    }
    push_scalar(static_cast<std::int64_t>(v));
  }

  // One opcode; false after STOP.
  bool step(unsigned char op, std::size_t at) {
    switch (op) {
      case 0x80: {  // PROTO
        const auto v = static_cast<unsigned char>(take(1)[0]);
        if (v < 2 || v > 5) fail(fmt::format("protocol {} is not supported (2 to 5 are read)", v), at);
        return true;
      }
      case 0x95: take(8); return true;  // FRAME: a length hint
      case '}': push_value(Value{Value::Kind::dict, {}, {}, {}}); return true;
      case ']':
      case ')': push_value(Value{Value::Kind::list, {}, {}, {}}); return true;
      case '(': marks_.push_back(stack_.size()); return true;
      case 's': {  // SETITEM
        const std::size_t v = pop(), k = pop();
        set_items({k, v}, "SETITEM");
        return true;
      }
      case 'u': set_items(pop_to_mark(), "SETITEMS"); return true;
      case 'a': {  // APPEND
        const std::size_t v = pop();
        top(Value::Kind::list, "APPEND").items.push_back(v);
        return true;
      }
      case 'e': {  // APPENDS
        const auto items = pop_to_mark();
        auto& list = top(Value::Kind::list, "APPENDS").items;
        list.insert(list.end(), items.begin(), items.end());
        return true;
      }
      case 't': {  // TUPLE
        auto items = pop_to_mark();
        push_value(Value{Value::Kind::list, {}, std::move(items), {}});
        return true;
      }
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        std::vector<std::size_t> items(op - 0x84);
        for (std::size_t i = items.size(); i-- > 0;) items[i] = pop();
        push_value(Value{Value::Kind::list, {}, std::move(items), {}});
        return true;
      }
      case 'J': push_scalar(static_cast<std::int32_t>(static_cast<std::uint32_t>(le(4)))); return true;
      case 'K': push_scalar(le(1)); return true;
      case 'M': push_scalar(le(2)); return true;
      case 0x8a: push_long(le(1)); return true;  // LONG1
      case 0x8b: push_long(le(4)); return true;  // LONG4
      case 'G': {                                // BINFLOAT: big-endian double
        const std::string_view s = take(8);
        std::uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = bits << 8 | static_cast<unsigned char>(s[i]);
        const double d = std::bit_cast<double>(bits);
        push_scalar(std::isfinite(d) ? nlohmann::json(d) : nlohmann::json(nullptr));
        return true;
      }
      case 0x8c: push_text(le(1)); return true;  // SHORT_BINUNICODE
      case 'X': push_text(le(4)); return true;   // BINUNICODE
      case 0x8d: push_text(le(8)); return true;  // BINUNICODE8
      case 'N': push_scalar(nullptr); return true;
      case 0x88: push_scalar(true); return true;
      case 0x89: push_scalar(false); return true;
      case 0x94: memo_put(memo_.size()); return true;  // MEMOIZE
      case 'q': memo_put(le(1)); return true;          // BINPUT
      case 'r': memo_put(le(4)); return true;          // LONG_BINPUT
      case 'h': memo_get(le(1)); return true;          // BINGET
      case 'j': memo_get(le(4)); return true;          // LONG_BINGET
      case '0': pop(); return true;                    // POP
      case '1': pop_to_mark(); return true;            // POP_MARK
      case '.': return false;                          // STOP
      default: break;
    }
    fail(fmt::format("opcode {} is not read (it is not part of a memory snapshot: only dicts, lists, tuples, "
                     "strings, numbers, booleans and None are)",
                     name(op)),
         at);
  }

  static std::string name(unsigned char op) {
    switch (op) {
      case 'c': return "GLOBAL (0x63)";
      case 0x93: return "STACK_GLOBAL (0x93)";
      case 'R': return "REDUCE (0x52)";
      case 'b': return "BUILD (0x62)";
      case 0x81: return "NEWOBJ (0x81)";
      case 0x92: return "NEWOBJ_EX (0x92)";
      case 'i': return "INST (0x69)";
      case 'o': return "OBJ (0x6f)";
      case 'C':
      case 'B':
      case 0x8e:
      case 0x96: return fmt::format("bytes ({:#04x})", op);
      case 0x8f:
      case 0x90:
      case 0x91: return fmt::format("set ({:#04x})", op);
      case 'I':
      case 'L':
      case 'F':
      case 'S':
      case 'V':
      case 'p':
      case 'g':
      case 'd':
      case 'l': return fmt::format("{:#04x} ('{}', protocol 0 text)", op, static_cast<char>(op));
      default: return fmt::format("{:#04x}", op);
    }
  }

  nlohmann::json to_json(std::size_t index, int depth, std::size_t& budget) const {
    if (depth > kMaxPickleDepth)
      fail(fmt::format("nesting deeper than {} levels (or a value that contains itself)", kMaxPickleDepth));
    if (budget-- == 0) fail("a value that expands beyond the reader's limit");
    const Value& v = values_[index];
    switch (v.kind) {
      case Value::Kind::scalar: return v.scalar;
      case Value::Kind::list: {
        nlohmann::json out = nlohmann::json::array();
        for (std::size_t i : v.items) out.push_back(to_json(i, depth + 1, budget));
        return out;
      }
      case Value::Kind::dict: {
        nlohmann::json out = nlohmann::json::object();
        for (const auto& [k, i] : v.pairs)
          out[k] = selector_ && k == selector_->key && values_[i].kind == Value::Kind::list
                       ? selected(i, depth + 1, budget)
                       : to_json(i, depth + 1, budget);
        return out;
      }
    }
    return nullptr;
  }

  // The kept items of a list under the selector's key: chosen once per distinct list (the memo
  // shares one among many dicts), then copied. Every copy is charged to the budget as if it had
  // been expanded, so a selector that keeps everything is bounded as before.
  nlohmann::json selected(std::size_t index, int depth, std::size_t& budget) const {
    if (depth > kMaxPickleDepth)
      fail(fmt::format("nesting deeper than {} levels (or a value that contains itself)", kMaxPickleDepth));
    auto it = selected_.find(index);
    if (it == selected_.end()) {
      const std::vector<std::size_t>& items = values_[index].items;
      const std::function<nlohmann::json(std::size_t)> item = [&](std::size_t i) {
        if (i >= items.size()) fail(fmt::format("the selector asked for item {} of {}", i, items.size()));
        return to_json(items[i], depth + 1, budget);
      };
      Selected s{nlohmann::json::array(), 1};
      for (std::size_t i : selector_->select(items.size(), item)) {
        std::size_t before = budget;
        s.value.push_back(item(i));
        s.values += before - budget;
      }
      it = selected_.emplace(index, std::move(s)).first;
    }
    if (budget < it->second.values) fail("a value that expands beyond the reader's limit");
    budget -= it->second.values;
    return it->second.value;
  }

  std::string_view d_;
  const std::string& what_;
  std::size_t pos_ = 0;
  std::vector<Value> values_;
  std::vector<std::size_t> stack_, marks_;
  std::unordered_map<std::uint64_t, std::size_t> memo_;
  const ListSelector* selector_;
  struct Selected {
    nlohmann::json value;
    std::size_t values;  // how many values a copy counts for
  };
  mutable std::unordered_map<std::size_t, Selected> selected_;  // by arena index
};

void put_le(std::string& out, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>(v >> (8 * i) & 0xff));
}

// An integer as Python's pickle writes it at protocol 2 (save_long): BININT1, BININT2 or BININT
// when it fits, else LONG1 with the fewest bytes of two's complement that hold it. `bits` is the
// value's 64-bit pattern, read as signed when `negative`.
void write_int(std::string& out, std::uint64_t bits, bool negative) {
  const auto i = static_cast<std::int64_t>(bits);
  if (!negative && bits <= 0xff) {
    out.push_back('K');
    put_le(out, bits, 1);
  } else if (!negative && bits <= 0xffff) {
    out.push_back('M');
    put_le(out, bits, 2);
  } else if (negative ? i >= INT32_MIN : bits <= INT32_MAX) {
    out.push_back('J');
    put_le(out, bits, 4);
  } else {
    // Bytes until the rest is all sign: the top byte's high bit must then be the sign.
    int n = 1;
    while (n < 8 && (negative ? i >> (8 * n - 1) != -1 : bits >> (8 * n - 1) != 0)) ++n;
    const bool spill = !negative && n == 8 && bits >> 63 != 0;  // above INT64_MAX: a ninth, zero byte
    out += "\x8a";
    out.push_back(static_cast<char>(n + (spill ? 1 : 0)));
    put_le(out, bits, n);
    if (spill) out.push_back('\0');
  }
}

void write(std::string& out, const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: out.push_back('N'); return;
    case nlohmann::json::value_t::boolean: out.push_back(v.get<bool>() ? '\x88' : '\x89'); return;
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      if (v.is_number_unsigned()) write_int(out, v.get<std::uint64_t>(), false);
      else write_int(out, static_cast<std::uint64_t>(v.get<std::int64_t>()), v.get<std::int64_t>() < 0);
      return;
    case nlohmann::json::value_t::number_float: {
      out.push_back('G');
      const auto bits = std::bit_cast<std::uint64_t>(v.get<double>());
      for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>(bits >> (8 * i) & 0xff));
      return;
    }
    case nlohmann::json::value_t::string: {
      const auto& s = v.get_ref<const std::string&>();
      out.push_back('X');
      put_le(out, s.size(), 4);
      out += s;
      return;
    }
    case nlohmann::json::value_t::array:
      out.push_back(']');
      if (!v.empty()) {
        out.push_back('(');
        for (const auto& e : v) write(out, e);
        out.push_back('e');
      }
      return;
    case nlohmann::json::value_t::object:
      out.push_back('}');
      if (!v.empty()) {
        out.push_back('(');
        for (const auto& [k, e] : v.items()) {
          write(out, nlohmann::json(k));
          write(out, e);
        }
        out.push_back('u');
      }
      return;
    default: throw InvalidArgument("write_pickle: a JSON value with no pickle form");
  }
}

}  // namespace

nlohmann::json read_pickle(std::string_view data, const std::string& what, const ListSelector* selector) {
  return Reader(data, what, selector).run();
}

std::string write_pickle(const nlohmann::json& value) {
  std::string out = "\x80\x02";
  write(out, value);
  out.push_back('.');
  return out;
}

}  // namespace stowage::inspect
