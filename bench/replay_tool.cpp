// Replays an allocation event log (docs/event_log.md) through stowage's CachingAllocator on an
// emulated device and through glibc malloc, printing peak allocated / reserved bytes and time.
//   replay_tool LOG.csv [--segments expandable|classic] [--repeat N]
//   replay_tool --synthesize LOG.csv [--layers 24 --hidden 2048 --seq 2048 --batch 4]
// --synthesize writes the log of one transformer training step (activations kept layer by layer
// in forward, freed in reverse in backward, with gradient buckets and workspaces) through the
// real EventLog writer, so replay has a realistic input without a GPU.
#include <dlfcn.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/config.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/event_log.hpp"
#include "stowage/logging_resource.hpp"

using namespace stowage;
using Clock = std::chrono::steady_clock;

namespace {

struct Result {
  std::string name;
  std::size_t ops = 0, skipped = 0;
  double ms = 0;
  std::int64_t peak_allocated = -1, peak_reserved = -1;
};

// Peak bytes the log itself has live (what any allocator must hold at least).
std::int64_t peak_requested(const std::vector<EventRecord>& log) {
  std::unordered_map<std::uintptr_t, std::size_t> live;
  std::int64_t now = 0, peak = 0;
  for (const auto& r : log) {
    if (r.action == EventAction::allocate) {
      live[r.pointer] = r.size;
      now += static_cast<std::int64_t>(r.size);
      peak = std::max(peak, now);
    } else if (auto it = live.find(r.pointer); it != live.end()) {
      now -= static_cast<std::int64_t>(it->second);
      live.erase(it);
    }
  }
  return peak;
}

// Runs the log through alloc/free; frees of pointers the log never allocated are skipped.
template <class Alloc, class Free, class After>
Result replay(const std::string& name, const std::vector<EventRecord>& log, Alloc alloc, Free dealloc, After after) {
  Result r{name};
  std::unordered_map<std::uintptr_t, std::pair<void*, std::size_t>> live;
  live.reserve(log.size());
  const auto start = Clock::now();
  for (const auto& e : log) {
    if (e.action == EventAction::allocate) {
      live[e.pointer] = {alloc(e.size, e.stream), e.size};
    } else if (auto it = live.find(e.pointer); it != live.end()) {
      dealloc(it->second.first, it->second.second, e.stream);
      live.erase(it);
    } else {
      ++r.skipped;
      continue;
    }
    ++r.ops;
    after();
  }
  for (auto& [old, p] : live) dealloc(p.first, p.second, 0);
  r.ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return r;
}

Result replay_stowage(const std::vector<EventRecord>& log, std::size_t capacity, SegmentMode mode) {
  auto device = make_emulated_device(0, EmulatedOptions{.capacity = capacity});
  AllocatorOptions options;
  options.segments = mode;
  CachingAllocator allocator(*device, options);
  std::map<std::uint64_t, Stream> streams{{0, kDefaultStream}};
  for (const auto& e : log)
    if (!streams.count(e.stream)) streams[e.stream] = device->create_stream();
  Result r = replay(
      std::string("stowage CachingAllocator (") + (mode == SegmentMode::expandable ? "expandable" : "classic") + ")",
      log, [&](std::size_t n, std::uint64_t s) { return allocator.allocate(n, streams[s]); },
      [&](void* p, std::size_t, std::uint64_t) { allocator.deallocate(p); }, [] {});
  const AllocatorStats st = allocator.stats();
  r.peak_allocated = st.allocated_bytes.all.peak;
  r.peak_reserved = st.reserved_bytes.all.peak;
  device->synchronize();
  allocator.empty_cache();
  for (auto& [value, s] : streams)
    if (s != kDefaultStream) device->destroy_stream(s);
  return r;
}

// glibc's own malloc, even when jemalloc replaces malloc in this executable.
struct Glibc {
  void* (*malloc)(std::size_t) = nullptr;
  void (*free)(void*) = nullptr;
  struct mallinfo2 (*mallinfo2)() = nullptr;
  Glibc() {
    void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (!libc) return;
    malloc = reinterpret_cast<void* (*)(std::size_t)>(dlsym(libc, "malloc"));
    free = reinterpret_cast<void (*)(void*)>(dlsym(libc, "free"));
    mallinfo2 = reinterpret_cast<struct mallinfo2 (*)()>(dlsym(libc, "mallinfo2"));
  }
};

Result replay_glibc(const std::vector<EventRecord>& log) {
  static Glibc g;
  if (!g.malloc || !g.free || !g.mallinfo2) return {"glibc malloc (not found)"};
  auto alloc = [&](std::size_t n, std::uint64_t) { return g.malloc(n); };
  auto dealloc = [&](void* p, std::size_t, std::uint64_t) { g.free(p); };
  Result timed = replay("glibc malloc", log, alloc, dealloc, [] {});
  // A second, untimed pass samples glibc's own accounting after every operation.
  const struct mallinfo2 base = g.mallinfo2();
  std::int64_t peak_used = 0, peak_held = 0;
  replay("", log, alloc, dealloc, [&] {
    const struct mallinfo2 m = g.mallinfo2();
    peak_used = std::max<std::int64_t>(peak_used, static_cast<std::int64_t>(m.uordblks + m.hblkhd) -
                                                      static_cast<std::int64_t>(base.uordblks + base.hblkhd));
    peak_held = std::max<std::int64_t>(
        peak_held, static_cast<std::int64_t>(m.arena + m.hblkhd) - static_cast<std::int64_t>(base.arena + base.hblkhd));
  });
  timed.peak_allocated = peak_used;
  timed.peak_reserved = peak_held;
  return timed;
}

void synthesize(const std::string& path, int layers, std::int64_t hidden, std::int64_t seq, std::int64_t batch) {
  const std::size_t sbh2 = static_cast<std::size_t>(seq * batch * hidden * 2);  // one bf16 activation
  auto device = make_emulated_device(0, EmulatedOptions{.capacity = std::size_t{1} << 40});
  CachingAllocator allocator(*device);
  LoggingResource log(allocator, std::make_shared<EventLog>(path));
  const std::size_t per_layer[] = {sbh2,     3 * sbh2, sbh2, sbh2,
                                   4 * sbh2, 4 * sbh2, sbh2};  // ln, qkv, attn, proj, fc1, act, fc2
  std::vector<std::vector<void*>> saved(static_cast<std::size_t>(layers));
  std::vector<void*> buckets;
  for (int l = 0; l < layers; ++l) {
    for (std::size_t bytes : per_layer) saved[l].push_back(log.allocate(bytes));
    log.deallocate(log.allocate(32u << 20));  // a GEMM workspace
  }
  for (int l = layers; l-- > 0;) {
    void* grad = log.allocate(4 * sbh2);  // gradient of the widest activation
    void* grad_in = log.allocate(sbh2);
    log.deallocate(grad);
    for (auto it = saved[l].rbegin(); it != saved[l].rend(); ++it) log.deallocate(*it);
    log.deallocate(grad_in);
    if (l % 4 == 0) buckets.push_back(log.allocate(25u << 20));  // a gradient bucket
  }
  for (void* b : buckets) log.deallocate(b);
}

std::string mib(std::int64_t bytes) {
  char buf[32];
  if (bytes < 0) return "n/a";
  std::snprintf(buf, sizeof buf, "%.1f", bytes / 1048576.0);
  return buf;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::string> args(argv + 1, argv + argc);
  auto option = [&](const std::string& name, std::int64_t fallback) {
    auto it = std::find(args.begin(), args.end(), name);
    return it != args.end() && it + 1 != args.end() ? std::stoll(*(it + 1)) : fallback;
  };
  if (args.size() >= 2 && args[0] == "--synthesize") {
    synthesize(args[1], static_cast<int>(option("--layers", 24)), option("--hidden", 2048), option("--seq", 2048),
               option("--batch", 4));
    std::printf("wrote %s\n", args[1].c_str());
    return 0;
  }
  if (args.empty() || args[0].rfind("--", 0) == 0) {
    std::fprintf(stderr,
                 "usage: replay_tool LOG.csv [--repeat N] | replay_tool --synthesize LOG.csv [--layers L ...]\n");
    return 2;
  }
  const auto log = read_event_log(args[0]);
  const int repeat = static_cast<int>(option("--repeat", 1));
  std::vector<EventRecord> events;
  for (int i = 0; i < repeat; ++i) events.insert(events.end(), log.begin(), log.end());
  const std::int64_t peak = peak_requested(log);
  const std::size_t capacity = std::max<std::size_t>(std::size_t{1} << 30, static_cast<std::size_t>(peak) * 2);
  std::vector<Result> results{replay_stowage(events, capacity, SegmentMode::expandable),
                              replay_stowage(events, capacity, SegmentMode::classic), replay_glibc(events)};
  std::printf("log %s: %zu events x %d, peak live requested %s MiB\n\n", args[0].c_str(), log.size(), repeat,
              mib(peak).c_str());
  std::printf("| allocator | ops | ns/op | peak allocated MiB | peak reserved MiB | reserved / requested |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  for (const auto& r : results)
    std::printf(
        "| %s | %zu | %.0f | %s | %s | %s |\n", r.name.c_str(), r.ops, r.ops ? r.ms * 1e6 / r.ops : 0.0,
        mib(r.peak_allocated).c_str(), mib(r.peak_reserved).c_str(),
        r.peak_reserved < 0 ? "n/a" : std::to_string(static_cast<double>(r.peak_reserved) / peak).substr(0, 5).c_str());
  for (const auto& r : results)
    if (r.skipped)
      std::printf("\n%s: %zu frees of pointers the log never allocated were skipped\n", r.name.c_str(), r.skipped);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "replay_tool: %s\n", e.what());
  return 1;
}
