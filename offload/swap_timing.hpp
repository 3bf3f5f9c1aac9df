#pragma once
// Device-side timing for the swap scheduler: spans between two timing events on one stream
// (a copy, or the compute stream standing at a wait), settled once their events complete.
#include <array>
#include <vector>

#include "stowage/device.hpp"

namespace stowage::offload {

// Recycled events, so the hot path creates none.
class EventPool {
 public:
  EventPool(Device& device, bool timing) : device_(device), timing_(timing) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  Event take();
  void give(Event e) { free_.push_back(e); }

 private:
  Device& device_;
  bool timing_;
  std::vector<Event> free_, all_;
};

enum class SpanKind { d2h, h2d, compute_wait };

class SpanTimer {
 public:
  explicit SpanTimer(Device& device) : device_(device), events_(device, true) {}
  // Records the start on `stream`; end() closes the span opened last on that stream.
  void begin(Stream stream);
  void end(Stream stream, SpanKind kind);
  // Drops the span opened last on `stream` and not closed (the work it timed was never issued).
  void cancel(Stream stream);
  // Adds finished spans to the totals; `wait`: block until every open span has finished.
  void settle(bool wait);
  double total_ms(SpanKind kind) const { return totals_[static_cast<int>(kind)]; }
  void reset_totals() { totals_ = {}; }

 private:
  struct Span {
    Event start{}, stop{};
    Stream stream{};
    SpanKind kind = SpanKind::d2h;
    bool closed = false;
  };
  Device& device_;
  EventPool events_;
  std::vector<Span> spans_;
  std::array<double, 3> totals_{};
};

}  // namespace stowage::offload
