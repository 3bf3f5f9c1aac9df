// Configuration text on arbitrary bytes. The first byte picks the entry point:
//  - load_config: each STOWAGE_* variable the loader asks for is set, when its bit in the
//    second byte is, to the next line of the rest (so variables added later get values too);
//  - parse_allocator_options (STOWAGE_ALLOC_CONF), parse_fault_plan (STOWAGE_FAULTS),
//    parse_byte_size, parse_log_level on the rest.
// Each either gives a value or a ParseError; a value holds its documented ranges and, written
// back as text, reads back the same. Accepted allocator options also build a working allocator.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/config.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/fault_injection.hpp"

namespace {

using namespace stowage;

constexpr std::size_t MiB = std::size_t{1} << 20;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "configuration parser: %s\n", what);
  std::abort();
}

// Text the program wrote from accepted values must be accepted again.
template <class F>
auto reread(F&& parse) {
  try {
    return parse();
  } catch (const ParseError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    fail("refused its own written-back text");
  }
}

bool same(const AllocatorOptions& a, const AllocatorOptions& b) {
  return a.segments == b.segments && a.memory_cap_bytes == b.memory_cap_bytes &&
         a.memory_cap_fraction == b.memory_cap_fraction && a.gc_threshold == b.gc_threshold &&
         a.max_split_size == b.max_split_size && a.trace_entries == b.trace_entries &&
         a.expandable_reserve == b.expandable_reserve;
}

std::string as_text(const AllocatorOptions& o) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "expandable_segments:%s,max_split_size_mb:%zu,memory_cap_mb:%zu,memory_cap_fraction:%.17g,"
                "trace_entries:%zu,expandable_reserve_mb:%zu",
                o.segments == SegmentMode::expandable ? "True" : "False", o.max_split_size / MiB,
                o.memory_cap_bytes / MiB, o.memory_cap_fraction, o.trace_entries, o.expandable_reserve / MiB);
  std::string text = buf;
  // Off (0) has no text: the key takes a threshold strictly between 0 and 1, as PyTorch's.
  if (o.gc_threshold != 0) {
    std::snprintf(buf, sizeof buf, ",garbage_collection_threshold:%.17g", o.gc_threshold);
    text += buf;
  }
  return text;
}

void check_allocator_options(const AllocatorOptions& o) {
  if (!(o.gc_threshold == 0 || (o.gc_threshold > 0 && o.gc_threshold < 1)))
    fail("garbage_collection_threshold neither off nor strictly between 0 and 1");
  if (!(o.memory_cap_fraction >= 0 && o.memory_cap_fraction <= 1)) fail("memory_cap_fraction outside [0, 1]");
  if (o.max_split_size != 0 && o.max_split_size <= 20 * MiB) fail("max_split_size_mb of 20 or less accepted");
  if (o.max_split_size % MiB || o.memory_cap_bytes % MiB || o.expandable_reserve % MiB) fail("MiB sizes not whole");
  if (!same(reread([&] { return parse_allocator_options(as_text(o)); }), o))
    fail("allocator options written back read differently");
  // The options the parser lets through build an allocator that works, or refuse with a
  // stowage::Error (e.g. an address reservation the device cannot make).
  EmulatedOptions eo;
  eo.capacity = 8 * MiB;
  auto dev = make_emulated_device(0, eo);
  try {
    CachingAllocator a(*dev, o);
    void* p = a.allocate(1000);
    a.deallocate(p);
    a.empty_cache();
  } catch (const Error&) {
  }
}

void check_fault_plan(const FaultPlan& p) {
  const std::string text = "alloc=" + std::to_string(p.allocation_every) + ",map=" + std::to_string(p.map_every) +
                           ",pin=" + std::to_string(p.pin_every) + ",copy=" + std::to_string(p.copy_every) +
                           ",record=" + std::to_string(p.record_every);
  const FaultPlan q = reread([&] { return parse_fault_plan(text); });
  if (q.allocation_every != p.allocation_every || q.map_every != p.map_every || q.pin_every != p.pin_every ||
      q.copy_every != p.copy_every || q.record_every != p.record_every)
    fail("fault plan written back reads differently");
}

void check_byte_size(std::size_t bytes) {
  // An accepted size came through a double: its exact decimal reads back to it.
  if (reread([&] { return parse_byte_size(std::to_string(bytes)); }) != bytes)
    fail("byte size written back reads differently");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  try {
    switch (data[0] % 5) {
      case 0: {
        // The loader's lookups, in order, take the next line of `rest` when their bit is set.
        std::vector<std::string> lines;
        std::size_t start = 0;
        for (;;) {
          const auto nl = rest.find('\n', start);
          lines.push_back(rest.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
          if (nl == std::string::npos) break;
          start = nl + 1;
        }
        std::size_t asked = 0, used = 0;
        const std::uint8_t mask = data[1];
        const Config c = load_config([&](const char*) -> const char* {
          const bool set = asked < 8 && ((mask >> asked) & 1u);
          ++asked;
          if (!set || used >= lines.size()) return nullptr;
          return lines[used++].c_str();
        });
        if (c.emulated_devices < 1 || c.emulated_devices > 64) fail("STOWAGE_EMULATED_DEVICES outside 1..64");
        if (c.emulated.capacity == 0) fail("STOWAGE_EMULATED_CAPACITY of 0 accepted");
        if (!std::isfinite(c.emulated.link_bandwidth_gbps) || c.emulated.link_bandwidth_gbps < 0)
          fail("STOWAGE_EMULATED_LINK_GBPS not a finite, non-negative number");
        if (reread([&] { return parse_log_level(to_string(c.log_level)); }) != c.log_level)
          fail("log level written back reads differently");
        check_allocator_options(c.allocator);
        break;
      }
      case 1: check_allocator_options(parse_allocator_options(rest)); break;
      case 2: check_fault_plan(parse_fault_plan(rest)); break;
      case 3: check_byte_size(parse_byte_size(rest)); break;
      default: {
        const LogLevel level = parse_log_level(rest);
        if (reread([&] { return parse_log_level(to_string(level)); }) != level)
          fail("log level written back reads differently");
      }
    }
  } catch (const ParseError& e) {
    if (std::string_view(e.what()).empty()) fail("ParseError without a message");
  }
  return 0;
}
