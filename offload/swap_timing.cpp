#include "offload/swap_timing.hpp"

#include <algorithm>

#include "common/log.hpp"

namespace stowage::offload {

EventPool::~EventPool() {
  for (Event e : all_) {
    try {
      device_.destroy_event(e);
    } catch (const std::exception& ex) {
      log().error("swap: destroying an event failed: {}", ex.what());
    }
  }
}

Event EventPool::take() {
  if (!free_.empty()) {
    const Event e = free_.back();
    free_.pop_back();
    return e;
  }
  all_.push_back(device_.create_event(timing_));
  return all_.back();
}

void SpanTimer::begin(Stream stream) {
  Span s;
  s.start = events_.take();
  s.stream = stream;
  try {
    device_.record(s.start, stream);
  } catch (...) {
    events_.give(s.start);
    throw;
  }
  spans_.push_back(s);
}

void SpanTimer::end(Stream stream, SpanKind kind) {
  auto it =
      std::find_if(spans_.rbegin(), spans_.rend(), [&](const Span& s) { return s.stream == stream && !s.closed; });
  if (it == spans_.rend()) return;
  const Event stop = events_.take();
  try {
    device_.record(stop, stream);
  } catch (...) {
    events_.give(stop);  // the span stays open, so cancel() drops it
    throw;
  }
  it->stop = stop;
  it->kind = kind;
  it->closed = true;
}

void SpanTimer::cancel(Stream stream) {
  auto it =
      std::find_if(spans_.rbegin(), spans_.rend(), [&](const Span& s) { return s.stream == stream && !s.closed; });
  if (it == spans_.rend()) return;
  events_.give(it->start);  // recording it again later is fine: a record replaces the point
  spans_.erase(std::next(it).base());
}

void SpanTimer::settle(bool wait) {
  std::erase_if(spans_, [&](const Span& s) {
    if (!s.closed) return false;
    if (wait) device_.synchronize(s.stop);
    else if (!device_.query(s.stop)) return false;
    totals_[static_cast<int>(s.kind)] += std::max(0.0f, device_.elapsed_ms(s.start, s.stop));
    events_.give(s.start);
    events_.give(s.stop);
    return true;
  });
}

}  // namespace stowage::offload
