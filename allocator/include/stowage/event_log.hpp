#pragma once
// The allocation event log: a CSV file with one line per allocation and free, in the columns of
// RMM's logging_resource_adaptor (docs/event_log.md). Written by EventLog (a LoggingResource
// feeds it), replayed by bench/replay_tool and read by `stowage inspect`.
#include <cstddef>
#include <cstdint>
#include <istream>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "stowage/device.hpp"

namespace stowage {

inline constexpr const char* kEventLogHeader = "Thread,Time,Action,Pointer,Size,Stream";

enum class EventAction { allocate, free };
const char* to_string(EventAction action);

struct EventRecord {
  std::uint64_t thread = 0;     // OS thread id
  double time = 0;              // seconds since the log was opened
  EventAction action = EventAction::allocate;
  std::uintptr_t pointer = 0;
  std::size_t size = 0;         // bytes asked for (also on free)
  std::uint64_t stream = 0;     // the Stream's value (cudaStream_t on CUDA)
};

// Writes the CSV through an spdlog file sink; thread-safe; every line is flushed as written,
// so the file is complete even if the process never shuts down cleanly.
class EventLog {
 public:
  // Truncates `path` and writes the header. InvalidArgument when the file cannot be opened.
  explicit EventLog(const std::string& path);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  void record(EventAction action, const void* pointer, std::size_t size, Stream stream);
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Reads an event log. ParseError naming `source` and the line number for a malformed line.
std::vector<EventRecord> parse_event_log(std::istream& in, const std::string& source = "event log");
// The same from a file; ParseError when it cannot be opened.
std::vector<EventRecord> read_event_log(const std::string& path);

}  // namespace stowage
