// Random sequences of allocator operations across several streams (alloc, free, record_stream,
// empty_cache, cap changes, streams held back so frees stay pending), checking after every
// operation: live blocks never overlap, statistics add up, and live contents (canaries) survive.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/emulated_device.hpp"

namespace {

using namespace stowage;

// Longest a held stream stays blocked; frees recorded on it stay pending meanwhile.
constexpr int kHoldMs = 5;

struct Live {
  std::size_t requested;
  std::uint8_t seed;
};

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "allocator invariant broken: %s\n", what);
  std::abort();
}

void fill(void* p, std::size_t n, std::uint8_t seed) {
  auto* b = static_cast<std::uint8_t*>(p);
  const std::size_t k = n < 16 ? n : 16;
  for (std::size_t i = 0; i < k; ++i) b[i] = static_cast<std::uint8_t>(seed + i);
  for (std::size_t i = 0; i < k; ++i) b[n - 1 - i] = static_cast<std::uint8_t>(seed ^ i);
}

bool intact(const void* p, std::size_t n, std::uint8_t seed) {
  auto* b = static_cast<const std::uint8_t*>(p);
  const std::size_t k = n < 16 ? n : 16;
  for (std::size_t i = 0; i < k; ++i)
    if (b[n - 1 - i] != static_cast<std::uint8_t>(seed ^ i)) return false;
  for (std::size_t i = 0; i < k && i < n - k; ++i)
    if (b[i] != static_cast<std::uint8_t>(seed + i)) return false;
  return true;
}

void check(const CachingAllocator& a, const std::map<std::uintptr_t, Live>& live) {
  std::uintptr_t end = 0;
  std::int64_t allocated = 0, requested = 0;
  for (auto& [addr, l] : live) {
    const std::size_t size = a.block_size(reinterpret_cast<void*>(addr));
    if (size < l.requested) fail("block smaller than requested");
    if (addr < end) fail("live blocks overlap");
    end = addr + size;
    allocated += static_cast<std::int64_t>(size);
    requested += static_cast<std::int64_t>(l.requested);
    if (!intact(reinterpret_cast<void*>(addr), l.requested, l.seed)) fail("live contents changed");
  }
  const AllocatorStats s = a.stats();
  if (s.allocated_bytes.all.current != allocated) fail("allocated_bytes.all.current != sum of live blocks");
  if (s.requested_bytes.all.current != requested) fail("requested_bytes.all.current != sum of requests");
  if (s.allocation.all.current != static_cast<std::int64_t>(live.size())) fail("allocation count");
  if (s.reserved_bytes.all.current < s.allocated_bytes.all.current) fail("reserved < allocated");
  if (s.allocated_bytes.all.current != s.allocated_bytes.small_pool.current + s.allocated_bytes.large_pool.current)
    fail("pool stats do not add up");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  EmulatedOptions o;
  o.capacity = 64 << 20;
  auto dev = make_emulated_device(0, o);
  AllocatorOptions ao;
  ao.segments = (size > 0 && (data[0] & 1)) ? SegmentMode::classic : SegmentMode::expandable;
  ao.trace_entries = 64;
  std::map<std::uintptr_t, Live> live;
  std::vector<std::shared_ptr<std::promise<void>>> held;
  {
    CachingAllocator a(*dev, ao);
    Stream streams[3] = {kDefaultStream, dev->create_stream(), dev->create_stream()};
    std::size_t i = 1;
    auto next = [&]() -> std::uint8_t { return i < size ? data[i++] : 0; };
    std::uint8_t seed = 1;
    auto release_all = [&] {
      for (auto& g : held) g->set_value();
      held.clear();
    };
    while (i < size) {
      const std::uint8_t op = next() % 8;
      const Stream s = streams[next() % 3];
      if (op <= 2) {  // allocate: sizes from bytes up to ~16 MiB, skewed small
        const int shift = next() % 25;
        const std::size_t n = (std::size_t{1} << shift) + next() * 37u;
        try {
          void* p = a.allocate(n, s);
          if (live.count(reinterpret_cast<std::uintptr_t>(p))) fail("address handed out twice");
          fill(p, n, seed);
          live[reinterpret_cast<std::uintptr_t>(p)] = {n, seed++};
        } catch (const OutOfMemory&) {
        }
      } else if (op <= 4 && !live.empty()) {  // free the k-th live block
        auto it = live.begin();
        std::advance(it, next() % live.size());
        a.deallocate(reinterpret_cast<void*>(it->first));
        live.erase(it);
      } else if (op == 5 && !live.empty()) {
        auto it = live.begin();
        std::advance(it, next() % live.size());
        a.record_stream(reinterpret_cast<void*>(it->first), s);
      } else if (op == 6) {
        release_all();  // empty_cache and a lower cap synchronize the device
        if (next() & 1) {
          a.empty_cache();
        } else {
          a.set_memory_cap(std::size_t{next()} << 18);  // 0 .. ~64 MiB; 0 removes it
        }
      } else if (op == 7 && s != kDefaultStream) {  // hold or release a stream
        if (held.size() < 4 && (next() & 1)) {
          auto gate = std::make_shared<std::promise<void>>();
          auto f = gate->get_future().share();
          // Timed, because the allocator may synchronize the device from inside allocate (the
          // retry after a refused growth) while this thread is the only one that opens gates.
          dev->launch_host(s, [f] { f.wait_for(std::chrono::milliseconds(kHoldMs)); });
          held.push_back(gate);
        } else if (!held.empty()) {
          held.back()->set_value();
          held.pop_back();
        }
      }
      check(a, live);
    }
    release_all();
    for (auto& [addr, l] : live) a.deallocate(reinterpret_cast<void*>(addr));
    dev->synchronize();
    a.empty_cache();
    if (a.stats().allocated_bytes.all.current != 0) fail("bytes left allocated");
  }
  if (dev->free_memory() != dev->capacity()) fail("device memory leaked after the allocator went");
  return 0;
}
