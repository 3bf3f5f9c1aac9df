// The event-log reader on arbitrary text: a ParseError that names the source and stays short
// (binary or huge lines included), or records. Records it accepts have a finite, non-negative
// time, are no more than the lines after the header, and written back as CSV (exact decimal
// times) read back to the same records.
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "stowage/event_log.hpp"

namespace {

using namespace stowage;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "event log reader: %s\n", what);
  std::abort();
}

std::string write_back(const std::vector<EventRecord>& records) {
  std::string out = std::string(kEventLogHeader) + "\n";
  char line[160];
  for (const EventRecord& r : records) {
    // %.17g: every double exactly, so the reader must give back the same value
    std::snprintf(line, sizeof line, "%" PRIu64 ",%.17g,%s,0x%" PRIxPTR ",%zu,%" PRIu64 "\n", r.thread, r.time,
                  to_string(r.action), r.pointer, r.size, r.stream);
    out += line;
  }
  return out;
}

bool same(const EventRecord& a, const EventRecord& b) {
  return a.thread == b.thread && a.time == b.time && a.action == b.action && a.pointer == b.pointer &&
         a.size == b.size && a.stream == b.stream;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<EventRecord> records;
  try {
    std::istringstream in(text);
    records = parse_event_log(in, "fuzz.csv");
  } catch (const ParseError& e) {
    const std::string message = e.what();
    if (message.rfind("fuzz.csv", 0) != 0) fail("error does not name the source");
    if (message.size() > 600) fail("error message grows with the input");
    return 0;
  }
  std::size_t lines = 0;
  for (char c : text) lines += c == '\n';
  if (records.size() > lines) fail("more records than lines after the header");
  for (const EventRecord& r : records)
    if (!std::isfinite(r.time) || r.time < 0) fail("accepted a time that is not a finite, non-negative number");
  std::istringstream again(write_back(records));
  const std::vector<EventRecord> back = parse_event_log(again, "fuzz.csv (written back)");
  if (back.size() != records.size()) fail("written back, a different number of records");
  for (std::size_t i = 0; i < back.size(); ++i)
    if (!same(back[i], records[i])) fail("written back, a different record");
  return 0;
}
