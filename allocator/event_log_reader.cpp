// Reads the event-log CSV back (for replay and `stowage inspect`), strictly: a malformed line is
// a ParseError naming the line, never a silently skipped record.
#include <charconv>
#include <cmath>
#include <fstream>
#include <string_view>

#include <fmt/format.h>

#include "stowage/event_log.hpp"

namespace stowage {

namespace {

template <class T>
bool parse_integer(std::string_view text, T& out) {
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    text.remove_prefix(2);
    base = 16;
  }
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out, base);
  return !text.empty() && ec == std::errc() && end == text.data() + text.size();
}

// from_chars also reads "inf" and "nan"; neither is a time.
bool parse_seconds(std::string_view text, double& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return !text.empty() && ec == std::errc() && end == text.data() + text.size() && std::isfinite(out) && out >= 0;
}

// Input text as an error message shows it: at most 80 bytes, other than printable ASCII as \xNN,
// so a binary or enormous line still gives a short, readable message.
std::string shown(std::string_view text) {
  constexpr std::size_t kMax = 80;
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F) out += static_cast<char>(c);
    else out += fmt::format("\\x{:02X}", c);
  }
  if (text.size() > kMax) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

}  // namespace

std::vector<EventRecord> parse_event_log(std::istream& in, const std::string& source) {
  std::vector<EventRecord> records;
  std::string line;
  std::size_t number = 0;
  bool header = false;
  auto fail = [&](std::string_view why) { return ParseError(fmt::format("{} line {}: {}", source, number, why)); };
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (!header) {
      if (line != kEventLogHeader)
        throw fail(fmt::format("expected the header '{}', got '{}'", kEventLogHeader, shown(line)));
      header = true;
      continue;
    }
    std::string_view fields[6];
    std::string_view rest = line;
    for (int i = 0; i < 6; ++i) {
      auto comma = rest.find(',');
      if ((comma == std::string_view::npos) != (i == 5))
        throw fail(fmt::format("expected 6 fields in '{}'", shown(line)));
      fields[i] = rest.substr(0, comma);
      if (comma != std::string_view::npos) rest.remove_prefix(comma + 1);
    }
    EventRecord r;
    if (!parse_integer(fields[0], r.thread)) throw fail(fmt::format("bad thread id '{}'", shown(fields[0])));
    if (!parse_seconds(fields[1], r.time)) throw fail(fmt::format("bad time '{}' (seconds)", shown(fields[1])));
    if (fields[2] == "allocate") r.action = EventAction::allocate;
    else if (fields[2] == "free") r.action = EventAction::free;
    else throw fail(fmt::format("bad action '{}' (allocate or free)", shown(fields[2])));
    if (!parse_integer(fields[3], r.pointer)) throw fail(fmt::format("bad pointer '{}'", shown(fields[3])));
    if (!parse_integer(fields[4], r.size)) throw fail(fmt::format("bad size '{}'", shown(fields[4])));
    if (!parse_integer(fields[5], r.stream)) throw fail(fmt::format("bad stream '{}'", shown(fields[5])));
    records.push_back(r);
  }
  if (in.bad()) throw ParseError(fmt::format("{}: read error after line {}", source, number));
  if (!header) throw ParseError(fmt::format("{}: empty, expected the header '{}'", source, kEventLogHeader));
  return records;
}

std::vector<EventRecord> read_event_log(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ParseError(fmt::format("event log '{}': cannot open", path));
  return parse_event_log(in, path);
}

}  // namespace stowage
