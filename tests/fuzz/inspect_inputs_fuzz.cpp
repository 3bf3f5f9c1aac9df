// `stowage inspect`'s readers on arbitrary input: an event-log CSV or a snapshot JSON, then the
// analysis and the reports. ParseError, or an analysis — never a crash. The first byte picks.
#include <cstdint>
#include <sstream>
#include <string>

#include "stowage/error.hpp"
#include "tools/common/json_input.hpp"
#include "tools/inspect/inspect_report.hpp"

using namespace stowage::inspect;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      std::istringstream in(text);
      const EventLogAnalysis a = analyze(stowage::parse_event_log(in, "fuzz"));
      (void)to_table(a);
      (void)timeline_svg(a, "fuzz");
    } else {
      stowage::tools::parse_json(text, "fuzz");
      const SnapshotAnalysis a = analyze(stowage::snapshot_from_json(text));
      (void)to_json(a).dump();
      (void)timeline_svg(a, "fuzz");
      (void)compare_json(a, a);
    }
  } catch (const stowage::Error&) {
  }
  return 0;
}
