// The emulated device: "device memory" is host memory of its own with a real capacity, each
// stream is a worker thread on the device's logical clock (stream_worker.hpp), events are
// sequence points with a logical time, and H2D/D2H copies go through copy engines that can be
// throttled to a link bandwidth.
#include <fmt/format.h>
#include <numa.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <shared_mutex>
#include <vector>

#include "common/fork_generation.hpp"
#include "device/emulated/copy_engine.hpp"
#include "device/emulated/emulated_memory.hpp"
#include "device/emulated/stream_worker.hpp"
#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"

namespace stowage {
namespace {

using emulated::Clock;
using emulated::StreamWorker;

// In a process forked from the one that made them, a stream's worker and an event cannot be
// destroyed: their condition variables still count the waiters of the parent's threads, which
// are not here, and destroying one would wait for them for ever. They are kept until the process
// ends (reachable, so a leak checker does not count them).
void keep_in_forked_child(std::shared_ptr<void> orphan) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::shared_ptr<void>>();  // NOLINT(cppcoreguidelines-owning-memory)
  std::lock_guard lock(mutex);
  kept->push_back(std::move(orphan));
}

// Stream and event ids are unique across every emulated device, so one device can tell a
// destroyed handle or another device's handle from its own.
std::atomic<std::uintptr_t> next_handle{1};

// Each record is a generation; a wait or query concerns the latest one at the time of the call,
// as in CUDA. Generations recorded on different streams may complete out of order (an event
// handed back to a pool and recorded again elsewhere), so completion is tracked per generation.
struct EventState {
  std::mutex mutex;
  std::condition_variable cv;
  std::uint64_t recorded = 0;
  std::set<std::uint64_t> outstanding;  // recorded, not yet reached by their stream
  std::uint64_t time_gen = 0;           // the generation `time` belongs to
  Clock::time_point time{};             // on the device's logical clock
  bool done(std::uint64_t gen) const { return !outstanding.contains(gen); }
};

Clock::duration slack_of(double ms) {
  if (!(ms >= 0) || ms > 3.6e6)
    throw InvalidArgument(fmt::format("emulated scheduling_slack_ms {} must be between 0 and one hour", ms));
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
}

double link_of(double gbps) {
  if (gbps != 0 && !(gbps >= kMinLinkGbps && gbps <= kMaxLinkGbps))
    throw InvalidArgument(fmt::format("emulated link bandwidth {} GB/s must be 0 (unthrottled) or between {} and {}",
                                      gbps, kMinLinkGbps, kMaxLinkGbps));
  return gbps;
}

std::vector<int> calling_thread_numa_nodes() {
  if (numa_available() < 0) return {0};
  const int cpu = sched_getcpu();
  const int node = cpu >= 0 ? numa_node_of_cpu(cpu) : 0;
  return {node < 0 ? 0 : node};
}

class EmulatedDevice final : public Device {
 public:
  EmulatedDevice(int ordinal, const EmulatedOptions& o)
      : memory_(ordinal, o.capacity, o.granularity),
        h2d_(link_of(o.link_bandwidth_gbps)),
        d2h_(link_of(o.link_bandwidth_gbps)),
        slack_(slack_of(o.scheduling_slack_ms)) {
    if (o.capacity == 0 || o.capacity > kMaxEmulatedCapacity)
      throw InvalidArgument(
          fmt::format("emulated device capacity {} B must be positive and at most {} B (128 TiB, "
                      "what a process can address)",
                      o.capacity, kMaxEmulatedCapacity));
    if (o.granularity == 0 || (o.granularity & (o.granularity - 1)) != 0 || o.granularity % 4096 != 0)
      throw InvalidArgument(
          fmt::format("emulated granularity {} must be a power of two multiple of 4096", o.granularity));
    props_.kind = DeviceKind::emulated;
    props_.ordinal = ordinal;
    props_.name = fmt::format("{} {} ({:.1f} GiB{})", o.name, ordinal, o.capacity / 1073741824.0,
                              o.link_bandwidth_gbps > 0 ? fmt::format(", link {:g} GB/s", o.link_bandwidth_gbps) : "");
    props_.capacity = o.capacity;
    props_.granularity = o.granularity;
    props_.virtual_memory = true;
    props_.partial_mapping = true;
    props_.host_numa_memory = true;
    props_.host_accessible = true;
    props_.numa_nodes = calling_thread_numa_nodes();
    streams_[0] = std::make_shared<StreamWorker>(0, slack_);
  }

  ~EmulatedDevice() override {
    check_no_dependents();
    if (forked()) {
      // Nothing the parent's threads wait on is destroyed here, and no lock is taken: one a
      // parent's thread held at the fork stays held in the child.
      keep_in_forked_child(std::make_shared<decltype(streams_)>(std::move(streams_)));
      keep_in_forked_child(std::make_shared<decltype(events_)>(std::move(events_)));
      return;
    }
    try {
      synchronize();
    } catch (...) {
    }
    std::unique_lock lock(streams_mutex_);
    streams_.clear();  // joins the workers
  }

  const DeviceProperties& properties() const override { return props_; }
  std::size_t free_memory() const override { return props_.capacity - memory_.used(); }
  DeviceCounters counters() const override {
    DeviceCounters c = memory_.counters();
    c.bytes_h2d = bytes_h2d_;
    c.bytes_d2h = bytes_d2h_;
    c.bytes_d2d = bytes_d2d_;
    return c;
  }

  // Memory in a forked child: the parent's (its mapped chunks are not even there), so refused.
  void* allocate(std::size_t bytes) override {
    check_not_forked();
    return memory_.allocate(bytes);
  }
  void deallocate(void* ptr) override {
    check_not_forked();
    memory_.deallocate(ptr);
  }
  void* reserve(std::size_t bytes) override {
    check_not_forked();
    return memory_.reserve(bytes);
  }
  void unreserve(void* base, std::size_t bytes) override {
    check_not_forked();
    memory_.unreserve(base, bytes);
  }
  PhysicalHandle create_physical(std::size_t bytes, const PhysicalOptions& o) override {
    check_not_forked();
    return memory_.create_physical(bytes, o);
  }
  void destroy_physical(PhysicalHandle h) override {
    check_not_forked();
    memory_.destroy_physical(h);
  }
  void map(void* va, std::size_t bytes, PhysicalHandle h, std::size_t offset) override {
    check_not_forked();
    memory_.map(va, bytes, h, offset);
  }
  void unmap(void* va, std::size_t bytes) override {
    check_not_forked();
    memory_.unmap(va, bytes);
  }
  void set_access(void* va, std::size_t bytes) override {
    check_not_forked();
    memory_.set_access(va, bytes);
  }
  int export_handle(PhysicalHandle h) override {
    check_not_forked();
    return memory_.export_handle(h);
  }

  Stream create_stream(int priority) override {
    check_not_forked();
    const auto [least, greatest] = priority_range();
    priority = std::clamp(priority, greatest, least);
    const auto id = next_handle.fetch_add(1);
    std::unique_lock lock(streams_mutex_);
    streams_[id] = std::make_shared<StreamWorker>(priority, slack_);
    return Stream{id};
  }

  void destroy_stream(Stream s) override {
    if (s == kDefaultStream) throw InvalidArgument(where() + ": the default stream cannot be destroyed");
    // In a forked child its worker is a parent's thread: the stream stays listed, untouched and
    // never drained, and no lock is taken (a parent's thread may have held it at the fork); the
    // device's destructor keeps it there.
    if (forked()) return;
    std::shared_ptr<StreamWorker> w = worker(s);
    // The stream stays listed (alive) until its work has run: whoever finds it gone may reuse
    // what it used without ordering after it.
    w->drain();
    {
      std::unique_lock lock(streams_mutex_);
      auto it = streams_.find(static_cast<std::uintptr_t>(s));
      if (it == streams_.end()) throw unknown("stream", static_cast<std::uintptr_t>(s));  // destroyed meanwhile
      streams_.erase(it);
    }
    w.reset();  // the last owner runs what was queued since, then joins
    count_destroyed_stream();
  }

  std::pair<int, int> priority_range() const override { return {0, -5}; }
  void check_stream(Stream s) override {
    if (s != kDefaultStream) worker(s);  // throws for a stream that is not this device's
  }

  void synchronize(Stream s) override { worker(s)->synchronize(); }

  void synchronize() override {
    check_not_forked();
    std::vector<std::shared_ptr<StreamWorker>> all;
    {
      std::shared_lock lock(streams_mutex_);
      for (auto& [id, w] : streams_) all.push_back(w);
    }
    std::exception_ptr first;
    for (auto& w : all) {
      try {
        w->synchronize();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }

  Event create_event(bool) override {
    check_not_forked();
    const auto id = next_handle.fetch_add(1);
    std::unique_lock lock(events_mutex_);
    events_[id] = std::make_shared<EventState>();
    return Event{id};
  }

  void destroy_event(Event e) override {
    if (forked()) return;  // as destroy_stream: kept, no lock taken
    std::unique_lock lock(events_mutex_);
    if (events_.erase(static_cast<std::uintptr_t>(e)) == 0) throw unknown("event", static_cast<std::uintptr_t>(e));
  }

  void record(Event e, Stream s) override {
    auto ev = event(e);
    auto w = worker(s);
    std::uint64_t gen;
    {
      std::lock_guard lock(ev->mutex);
      gen = ++ev->recorded;
      ev->outstanding.insert(gen);
    }
    w->submit([ev, gen] {
      const auto now = StreamWorker::ready();
      StreamWorker::finish_at(now);  // a record takes no device time
      std::lock_guard lock(ev->mutex);
      ev->outstanding.erase(gen);
      if (gen > ev->time_gen) {
        ev->time_gen = gen;
        ev->time = now;
      }
      ev->cv.notify_all();
    });
  }

  void wait(Stream s, Event e) override {
    auto ev = event(e);
    auto w = worker(s);
    std::uint64_t target;
    {
      std::lock_guard lock(ev->mutex);
      target = ev->recorded;
      if (ev->done(target)) return;  // nothing outstanding
    }
    w->submit([ev, target] {
      std::unique_lock lock(ev->mutex);
      ev->cv.wait(lock, [&] { return ev->done(target); });
      // The stream goes on when the waited-for work ended; if a later record has already
      // completed, that time is lost, and the wake-up is the conservative end.
      StreamWorker::finish_at(ev->time_gen == target ? std::max(StreamWorker::ready(), ev->time) : Clock::now());
    });
  }

  bool query(Event e) override {
    check_not_forked();  // a record queued before the fork would stay pending for ever
    auto ev = event(e);
    std::lock_guard lock(ev->mutex);
    return ev->done(ev->recorded);
  }

  void synchronize(Event e) override {
    check_not_forked();  // the streams that would complete its records are not in this process
    auto ev = event(e);
    std::unique_lock lock(ev->mutex);
    const auto target = ev->recorded;
    ev->cv.wait(lock, [&] { return ev->done(target); });
  }

  float elapsed_ms(Event start, Event end) override {
    check_not_forked();
    auto a = event(start), b = event(end);
    Clock::time_point ta, tb;
    {
      std::lock_guard lock(a->mutex);
      if (a->recorded == 0 || !a->done(a->recorded))
        throw InvalidArgument(where() + ": elapsed_ms: start event not recorded or not completed");
      ta = a->time;
    }
    {
      std::lock_guard lock(b->mutex);
      if (b->recorded == 0 || !b->done(b->recorded))
        throw InvalidArgument(where() + ": elapsed_ms: end event not recorded or not completed");
      tb = b->time;
    }
    return std::chrono::duration<float, std::milli>(tb - ta).count();
  }

  void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream s) override {
    if (bytes == 0) return;
    if (!dst || !src) throw InvalidArgument(where() + ": copy with a null pointer");
    auto w = worker(s);
    switch (kind) {
      case CopyKind::host_to_device:
        bytes_h2d_ += bytes;
        w->submit(
            [this, dst, src, bytes] { StreamWorker::finish_at(h2d_.copy(dst, src, bytes, StreamWorker::ready())); });
        break;
      case CopyKind::device_to_host:
        bytes_d2h_ += bytes;
        w->submit(
            [this, dst, src, bytes] { StreamWorker::finish_at(d2h_.copy(dst, src, bytes, StreamWorker::ready())); });
        break;
      case CopyKind::device_to_device: bytes_d2d_ += bytes; [[fallthrough]];
      case CopyKind::host_to_host: w->submit([dst, src, bytes] { std::memmove(dst, src, bytes); }); break;
    }
  }

  void fill_async(void* dst, std::uint8_t value, std::size_t bytes, Stream s) override {
    if (bytes == 0) return;
    if (!dst) throw InvalidArgument(where() + ": fill of a null pointer");
    worker(s)->submit([dst, value, bytes] { std::memset(dst, value, bytes); });
  }

  void pin_host(void* ptr, std::size_t bytes) override {
    check_not_forked();
    memory_.pin(ptr, bytes);
  }
  void unpin_host(void* ptr) override {
    check_not_forked();
    memory_.unpin(ptr);
  }
  bool is_pinned(const void* ptr) const override { return memory_.is_pinned(ptr); }
  // The emulated device addresses host memory directly; pinned memory is "mapped".
  void* device_pointer_of_host(void* host_ptr) override { return memory_.is_pinned(host_ptr) ? host_ptr : nullptr; }

  void launch_host(Stream s, std::function<void()> fn) override {
    if (!fn) throw InvalidArgument(where() + ": launch_host of an empty function");
    worker(s)->submit(std::move(fn));
  }

 private:
  std::string where() const { return fmt::format("emulated device {}", props_.ordinal); }

  InvalidArgument unknown(const char* what, std::uintptr_t id) const {
    return InvalidArgument(
        fmt::format("{}: {} {} is not one of this device's (destroyed, or another device's)", where(), what, id));
  }

  bool forked() const { return forked_since(generation_); }

  // In a forked child, stream work would wait for ever for threads that are not there, and memory
  // work would act on the parent's memory (emulated_memory.cpp: its mapped chunks are not there).
  void check_not_forked() const {
    if (forked())
      throw DeviceError(
          fmt::format("{}: used in a process forked from the one that made it; its streams are that process's "
                      "threads, which fork() does not copy, and its memory is that process's. Only destroying it "
                      "(or its streams and events) works here. Use stowage in a child process only after exec(), e.g. "
                      "with Python multiprocessing's 'spawn' or 'forkserver' start method (CUDA contexts do not "
                      "survive fork() either)",
                      where()));
  }

  std::shared_ptr<StreamWorker> worker(Stream s) {
    check_not_forked();
    std::shared_lock lock(streams_mutex_);
    auto it = streams_.find(static_cast<std::uintptr_t>(s));
    if (it == streams_.end()) throw unknown("stream", static_cast<std::uintptr_t>(s));
    return it->second;
  }

  std::shared_ptr<EventState> event(Event e) {
    std::shared_lock lock(events_mutex_);
    auto it = events_.find(static_cast<std::uintptr_t>(e));
    if (it == events_.end()) throw unknown("event", static_cast<std::uintptr_t>(e));
    return it->second;
  }

  unsigned generation_ = fork_generation();  // before the default stream's worker exists
  DeviceProperties props_;
  emulated::Memory memory_;
  emulated::CopyEngine h2d_, d2h_;
  Clock::duration slack_;
  std::atomic<std::uint64_t> bytes_h2d_{0}, bytes_d2h_{0}, bytes_d2d_{0};
  std::shared_mutex streams_mutex_, events_mutex_;
  std::map<std::uintptr_t, std::shared_ptr<StreamWorker>> streams_;
  std::map<std::uintptr_t, std::shared_ptr<EventState>> events_;
};

}  // namespace

std::unique_ptr<Device> make_emulated_device(int ordinal, const EmulatedOptions& options) {
  return std::make_unique<EmulatedDevice>(ordinal, options);
}

const char* to_string(CopyKind kind) {
  switch (kind) {
    case CopyKind::host_to_device: return "host_to_device";
    case CopyKind::device_to_host: return "device_to_host";
    case CopyKind::device_to_device: return "device_to_device";
    case CopyKind::host_to_host: return "host_to_host";
  }
  return "?";
}

}  // namespace stowage
