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
  std::uint64_t thread = 0;  // OS thread id
  double time = 0;           // seconds since the log was opened
  EventAction action = EventAction::allocate;
  std::uintptr_t pointer = 0;
  std::size_t size = 0;      // bytes asked for (also on free)
  std::uint64_t stream = 0;  // the Stream's value (cudaStream_t on CUDA)
};

// Writes the CSV; thread-safe. Each line goes to the file with one append (O_APPEND, a single
// write), so it is complete even if the process never shuts down cleanly, and lines from several
// processes never interleave. One file per process: `path` may hold %p (the process id), %r (the
// rank: RANK, else LOCAL_RANK, else 0) and %% (a %). A file another live process is writing is
// never truncated: this process then writes `<path>.<pid>` instead and says so on stderr.
class EventLog {
 public:
  // InvalidArgument when the file cannot be opened.
  explicit EventLog(const std::string& path);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  void record(EventAction action, const void* pointer, std::size_t size, Stream stream);
  const std::string& path() const;  // the file actually written

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The file name for `pattern` in this process: %p, %r and %% expanded (see EventLog).
std::string expand_event_log_path(const std::string& pattern);

// Reads an event log. ParseError naming `source` and the line number for a malformed line.
std::vector<EventRecord> parse_event_log(std::istream& in, const std::string& source = "event log");
// The same from a file; ParseError when it cannot be opened.
std::vector<EventRecord> read_event_log(const std::string& path);

}  // namespace stowage
