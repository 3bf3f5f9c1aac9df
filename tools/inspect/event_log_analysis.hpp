#pragma once
// What an event-log CSV (docs/event_log.md) says: live bytes over time, the peak, the largest
// requests, and what was never freed.
#include <cstdint>
#include <string>
#include <vector>

#include "stowage/event_log.hpp"

namespace stowage::inspect {

struct EventLogAnalysis {
  std::int64_t events = 0, allocations = 0, frees = 0;
  std::int64_t unmatched_frees = 0;  // frees of pointers the log never saw allocated
  std::int64_t peak_live = 0;        // bytes asked for and not yet freed, at most
  double peak_time = 0;              // seconds
  std::int64_t live_at_end = 0, live_blocks_at_end = 0;
  std::vector<std::pair<double, std::int64_t>> timeline;  // (seconds, live bytes)
  std::vector<EventRecord> largest;                       // largest allocations, largest first
};

EventLogAnalysis analyze(const std::vector<EventRecord>& records, std::size_t top = 10);

// Reads the CSV with stowage's reader, refusing files over the size limit first.
// ParseError naming the file and line.
std::vector<EventRecord> load_event_log(const std::string& path);

// Whether the file starts with the event-log header (else it is taken for a snapshot).
bool looks_like_event_log(const std::string& path);

}  // namespace stowage::inspect
