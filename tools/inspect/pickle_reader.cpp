#include "tools/inspect/pickle_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "stowage/error.hpp"

namespace stowage::inspect {

namespace {

// The arena holds each value once, 16 bytes, referred to by index: a memo reference costs an
// index, and a dict or list filled after it was memoized is the same value wherever the memo
// hands it out. Strings are views of the input; None, True and False are shared; a list's or
// dict's items (a dict's: key, value, key, ...) are a chain of links, one per item.
struct Value {
  enum class Kind : std::uint8_t { none, boolean, integer, unsigned_integer, real, string, list, dict };
  Kind kind = Kind::none;
  std::uint32_t count = 0;    // string: bytes; list, dict: links
  std::uint64_t payload = 0;  // the bits of a number; a string's offset; a list's first and last link
};
struct Link {
  std::uint32_t value, next;
};
constexpr std::uint32_t kNone = UINT32_MAX;  // no link, no memo entry
constexpr std::uint32_t kNull = 0, kFalse = 1, kTrue = 2;

class Reader {
 public:
  Reader(std::string_view data, const std::string& what, const ListSelector* selector)
      : d_(data), what_(what), selector_(selector), limit_(pickle_budget(data.size())) {
    values_ = {{Value::Kind::none}, {Value::Kind::boolean, 0, 0}, {Value::Kind::boolean, 0, 1}};
  }

  nlohmann::json run() {
    while (true) {
      if (pos_ >= d_.size()) fail("ends before STOP");
      const std::size_t at = pos_;
      const auto op = static_cast<unsigned char>(d_[pos_++]);
      if (!step(op, at)) break;
    }
    if (stack_.size() != 1) fail(fmt::format("STOP with {} values on the stack (one expected)", stack_.size()));
    PickleBudget budget = limit_;
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

  // Every table is bounded by kMaxPickleValues entries: at most 16 bytes an entry.
  void room(std::size_t size, const char* what) const {
    if (size >= kMaxPickleValues) fail(fmt::format("more {} than the reader's limit ({})", what, kMaxPickleValues));
  }
  void push(std::uint32_t index) {
    room(stack_.size(), "values on the stack");
    stack_.push_back(index);
  }
  std::uint32_t push_value(Value::Kind kind, std::uint64_t payload, std::uint32_t count = 0) {
    room(values_.size(), "values");
    values_.push_back({kind, count, payload});
    const auto index = static_cast<std::uint32_t>(values_.size() - 1);
    push(index);
    return index;
  }
  std::uint32_t pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back()))
      fail("a value is missing (stack underflow)");
    const std::uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  std::vector<std::uint32_t> pop_to_mark() {
    if (marks_.empty()) fail("no MARK for this opcode");
    const std::uint32_t m = marks_.back();
    marks_.pop_back();
    std::vector<std::uint32_t> out(stack_.begin() + m, stack_.end());
    stack_.resize(m);
    return out;
  }
  std::uint32_t top(Value::Kind kind, const char* op) const {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back()))
      fail(fmt::format("{} with nothing to add to", op));
    if (values_[stack_.back()].kind != kind)
      fail(fmt::format("{} on a value that is not a {}", op, kind == Value::Kind::dict ? "dict" : "list"));
    return stack_.back();
  }
  void append(std::uint32_t container, std::uint32_t item) {
    room(links_.size(), "items");
    links_.push_back({item, kNone});
    const auto link = static_cast<std::uint32_t>(links_.size() - 1);
    Value& c = values_[container];
    if (c.count++ == 0) c.payload = std::uint64_t{link} << 32 | link;
    else {
      links_[c.payload >> 32].next = link;
      c.payload = std::uint64_t{link} << 32 | (c.payload & UINT32_MAX);
    }
  }
  std::uint32_t push_list(const std::vector<std::uint32_t>& items) {
    const std::uint32_t list = push_value(Value::Kind::list, 0);
    for (std::uint32_t i : items) append(list, i);
    return list;
  }
  void set_items(const std::vector<std::uint32_t>& kv, const char* op) {
    if (kv.size() % 2 != 0) fail(fmt::format("{} with an odd number of keys and values", op));
    const std::uint32_t dict = top(Value::Kind::dict, op);
    for (std::size_t i = 0; i < kv.size(); i += 2) {
      const Value::Kind k = values_[kv[i]].kind;
      if (k != Value::Kind::string && k != Value::Kind::integer && k != Value::Kind::unsigned_integer)
        fail("a dict key that is not a string or an integer");
      append(dict, kv[i]);
      append(dict, kv[i + 1]);
    }
  }
  void memo_put(std::uint64_t id) {
    if (stack_.empty()) fail("memo store with an empty stack");
    if (id >= kMaxPickleValues) fail(fmt::format("memo {} is beyond the reader's limit ({})", id, kMaxPickleValues));
    if (id >= memo_.size()) memo_.resize(id + 1, kNone);
    if (memo_[id] == kNone) ++memo_count_;
    memo_[id] = stack_.back();
  }
  void memo_get(std::uint64_t id) {
    if (id >= memo_.size() || memo_[id] == kNone) fail(fmt::format("memo {} was never stored", id));
    push(memo_[id]);
  }
  void push_text(std::uint64_t n) {
    const std::size_t offset = pos_;
    const std::string_view s = take(n);
    if (n > UINT32_MAX) fail(fmt::format("a string of {} bytes (the reader's limit is 4 GiB)", n));
    try {
      (void)nlohmann::json(std::string(s)).dump();  // refuses text that is not UTF-8
    } catch (const nlohmann::json::exception&) {
      fail("a string that is not UTF-8");
    }
    push_value(Value::Kind::string, offset, static_cast<std::uint32_t>(n));
  }
  void push_int(std::int64_t v) { push_value(Value::Kind::integer, static_cast<std::uint64_t>(v)); }
  void push_long(std::size_t n) {
    if (n == 0) return push_int(0);
    if (n > 9) fail(fmt::format("an integer of {} bytes (wider than 64 bits)", n));
    const std::string_view s = take(n);
    const bool negative = (static_cast<unsigned char>(s[n - 1]) & 0x80) != 0;
    if (n == 9) {  // an unsigned 64-bit value has a ninth, zero byte
      if (s[8] != 0) fail("an integer wider than 64 bits");
      std::uint64_t v = 0;
      for (std::size_t i = 0; i < 8; ++i) v |= std::uint64_t(static_cast<unsigned char>(s[i])) << (8 * i);
      push_value(Value::Kind::unsigned_integer, v);
      return;
    }
    std::uint64_t v = negative ? ~std::uint64_t{0} : 0;
    for (std::size_t i = 0; i < n; ++i) {
      v &= ~(std::uint64_t{0xff} << (8 * i));
      v |= std::uint64_t(static_cast<unsigned char>(s[i])) << (8 * i);
    }
    push_int(static_cast<std::int64_t>(v));
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
      case '}': push_value(Value::Kind::dict, 0); return true;
      case ']':
      case ')': push_value(Value::Kind::list, 0); return true;
      case '(':
        room(marks_.size(), "MARKs");
        marks_.push_back(static_cast<std::uint32_t>(stack_.size()));
        return true;
      case 's': {  // SETITEM
        const std::uint32_t v = pop(), k = pop();
        set_items({k, v}, "SETITEM");
        return true;
      }
      case 'u': set_items(pop_to_mark(), "SETITEMS"); return true;
      case 'a': {  // APPEND
        const std::uint32_t v = pop();
        append(top(Value::Kind::list, "APPEND"), v);
        return true;
      }
      case 'e': {  // APPENDS
        const auto items = pop_to_mark();
        const std::uint32_t list = top(Value::Kind::list, "APPENDS");
        for (std::uint32_t i : items) append(list, i);
        return true;
      }
      case 't': push_list(pop_to_mark()); return true;  // TUPLE
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        std::vector<std::uint32_t> items(op - 0x84);
        for (std::size_t i = items.size(); i-- > 0;) items[i] = pop();
        push_list(items);
        return true;
      }
      case 'J': push_int(static_cast<std::int32_t>(static_cast<std::uint32_t>(le(4)))); return true;
      case 'K': push_value(Value::Kind::unsigned_integer, le(1)); return true;
      case 'M': push_value(Value::Kind::unsigned_integer, le(2)); return true;
      case 0x8a: push_long(le(1)); return true;  // LONG1
      case 0x8b: push_long(le(4)); return true;  // LONG4
      case 'G': {                                // BINFLOAT: big-endian double
        const std::string_view s = take(8);
        std::uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = bits << 8 | static_cast<unsigned char>(s[i]);
        if (std::isfinite(std::bit_cast<double>(bits))) push_value(Value::Kind::real, bits);
        else push(kNull);
        return true;
      }
      case 0x8c: push_text(le(1)); return true;  // SHORT_BINUNICODE
      case 'X': push_text(le(4)); return true;   // BINUNICODE
      case 0x8d: push_text(le(8)); return true;  // BINUNICODE8
      case 'N': push(kNull); return true;
      case 0x88: push(kTrue); return true;
      case 0x89: push(kFalse); return true;
      case 0x94: memo_put(memo_count_); return true;  // MEMOIZE
      case 'q': memo_put(le(1)); return true;         // BINPUT
      case 'r': memo_put(le(4)); return true;         // LONG_BINPUT
      case 'h': memo_get(le(1)); return true;         // BINGET
      case 'j': memo_get(le(4)); return true;         // LONG_BINGET
      case '0': pop(); return true;                   // POP
      case '1': pop_to_mark(); return true;           // POP_MARK
      case '.': return false;                         // STOP
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

  std::string_view text(const Value& v) const { return d_.substr(v.payload, v.count); }
  // The first link of a list or dict (kNone when empty); links_[l].next the one after l.
  static std::uint32_t first(const Value& v) { return v.count ? std::uint32_t(v.payload) : kNone; }
  std::vector<std::uint32_t> items(const Value& v) const {
    std::vector<std::uint32_t> out;
    out.reserve(v.count);
    for (std::uint32_t l = first(v); l != kNone; l = links_[l].next) out.push_back(links_[l].value);
    return out;
  }

  void charge(PickleBudget& budget, std::size_t values, std::size_t text) const {
    if (budget.values < values)
      fail(fmt::format("a value that expands beyond the reader's limit ({} values for a file of {} bytes)",
                       limit_.values, d_.size()));
    if (budget.text < text)
      fail(
          fmt::format("strings that expand beyond the reader's limit ({} bytes of text for a file of {} bytes; "
                      "each reference to a string counts)",
                      limit_.text, d_.size()));
    budget.values -= values;
    budget.text -= text;
  }
  void check_depth(int depth) const {
    if (depth > kMaxPickleDepth)
      fail(fmt::format("nesting deeper than {} levels (or a value that contains itself)", kMaxPickleDepth));
  }

  nlohmann::json to_json(std::uint32_t index, int depth, PickleBudget& budget) const {
    check_depth(depth);
    const Value& v = values_[index];
    charge(budget, 1, v.kind == Value::Kind::string ? v.count : 0);
    switch (v.kind) {
      case Value::Kind::none: return nullptr;
      case Value::Kind::boolean: return v.payload != 0;
      case Value::Kind::integer: return static_cast<std::int64_t>(v.payload);
      case Value::Kind::unsigned_integer: return v.payload;
      case Value::Kind::real: return std::bit_cast<double>(v.payload);
      case Value::Kind::string: return std::string(text(v));
      case Value::Kind::list: {
        nlohmann::json out = nlohmann::json::array();
        for (std::uint32_t l = first(v); l != kNone; l = links_[l].next)
          out.push_back(to_json(links_[l].value, depth + 1, budget));
        return out;
      }
      case Value::Kind::dict: {
        nlohmann::json out = nlohmann::json::object();
        for (std::uint32_t l = first(v); l != kNone; l = links_[links_[l].next].next) {
          const Value& k = values_[links_[l].value];
          const std::uint32_t value = links_[links_[l].next].value;  // keys and values come in pairs
          std::string key = k.kind == Value::Kind::string    ? std::string(text(k))
                            : k.kind == Value::Kind::integer ? std::to_string(static_cast<std::int64_t>(k.payload))
                                                             : std::to_string(k.payload);
          charge(budget, 0, key.size());
          const bool select = selector_ && key == selector_->key && values_[value].kind == Value::Kind::list;
          out[std::move(key)] = select ? selected(value, depth + 1, budget) : to_json(value, depth + 1, budget);
        }
        return out;
      }
    }
    return nullptr;
  }

  // A value the selector looks at: expanded once (charged in full), then shared by reference
  // (charged one value): PyTorch's stacks share their frames among thousands of lists.
  const nlohmann::json& inspected(std::uint32_t index, int depth, PickleBudget& budget) const {
    auto it = inspected_.find(index);
    if (it == inspected_.end() || it->second.depth < depth) {
      nlohmann::json value = to_json(index, depth, budget);
      it = inspected_.insert_or_assign(index, Cached{std::move(value), depth, 0, 0}).first;
    } else {
      charge(budget, 1, 0);
    }
    return it->second.value;
  }

  // The kept items of a list under the selector's key: chosen once per distinct list (the memo
  // shares one among many dicts), then copied. Every copy is charged as if it had been expanded.
  nlohmann::json selected(std::uint32_t index, int depth, PickleBudget& budget) const {
    check_depth(depth);
    auto it = selected_.find(index);
    if (it == selected_.end() || it->second.depth < depth) {
      const std::vector<std::uint32_t> list = items(values_[index]);
      const std::function<const nlohmann::json&(std::size_t)> item = [&](std::size_t i) -> const nlohmann::json& {
        if (i >= list.size()) fail(fmt::format("the selector asked for item {} of {}", i, list.size()));
        return inspected(list[i], depth + 1, budget);
      };
      Cached s{nlohmann::json::array(), depth, 1, 0};
      for (std::size_t i : selector_->select(list.size(), item)) {
        s.value.push_back(item(i));
        count(s.value.back(), s.values, s.text);
      }
      it = selected_.insert_or_assign(index, std::move(s)).first;
    }
    charge(budget, it->second.values, it->second.text);
    return it->second.value;
  }
  // What a copy of `j` is charged: its values and the bytes of its strings and keys.
  static void count(const nlohmann::json& j, std::size_t& values, std::size_t& text) {
    ++values;
    if (j.is_string()) text += j.get_ref<const std::string&>().size();
    if (j.is_object())
      for (const auto& [k, v] : j.items()) text += k.size();
    if (j.is_structured())
      for (const auto& v : j) count(v, values, text);
  }

  std::string_view d_;
  const std::string& what_;
  std::size_t pos_ = 0;
  std::vector<Value> values_;
  std::vector<Link> links_;
  std::vector<std::uint32_t> stack_, marks_;
  std::vector<std::uint32_t> memo_;  // by id: a value's index, or kNone
  std::size_t memo_count_ = 0;       // ids stored: MEMOIZE's next id (Python's len(memo))
  const ListSelector* selector_;
  const PickleBudget limit_;
  struct Cached {
    nlohmann::json value;
    int depth;                 // where it was expanded: deeper references expand it again
    std::size_t values, text;  // what a copy is charged (selected_)
  };
  mutable std::unordered_map<std::uint32_t, Cached> selected_, inspected_;  // by arena index
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

PickleBudget pickle_budget(std::size_t file_bytes) {
  const std::size_t n = std::min(file_bytes, std::size_t{1} << 40);
  return {std::min(kMaxPickleValues, (std::size_t{1} << 20) + n), (std::size_t{64} << 20) + 16 * n};
}

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
