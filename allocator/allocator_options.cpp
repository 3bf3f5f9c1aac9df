// PyTorch-style allocator configuration text: "key:value,key:value".
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>
#include <vector>

#include "fmt/format.h"
#include "stowage/allocator_options.hpp"
#include "stowage/error.hpp"

namespace stowage {
namespace {

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\n");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\n");
  return std::string(s.substr(b, e - b + 1));
}

std::uint64_t parse_count(const std::string& key, const std::string& v) {
  std::uint64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size()) {
    throw ParseError(fmt::format("allocator options: {}: expected a non-negative integer, got \"{}\"", key, v));
  }
  return out;
}

double parse_fraction(const std::string& key, const std::string& v) {
  double out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size() || !std::isfinite(out) || out < 0.0 || out > 1.0) {
    throw ParseError(fmt::format("allocator options: {}: expected a number in [0, 1], got \"{}\"", key, v));
  }
  return out;
}

bool parse_bool(const std::string& key, const std::string& v) {
  if (v == "True" || v == "true" || v == "1") return true;
  if (v == "False" || v == "false" || v == "0") return false;
  throw ParseError(fmt::format("allocator options: {}: expected True or False, got \"{}\"", key, v));
}

std::size_t mib_to_bytes(const std::string& key, std::uint64_t mib) {
  if (mib > (std::uint64_t{1} << 40)) {
    throw ParseError(fmt::format("allocator options: {}: {} MiB is too large", key, mib));
  }
  return static_cast<std::size_t>(mib) << 20;
}

// The items of "key:value,key:[a:b,c:d]": commas inside brackets (PyTorch's list values) do not
// separate items.
std::vector<std::string> split_items(std::string_view text) {
  std::vector<std::string> items;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ',';
    if (c == '[') ++depth;
    if (c == ']' && depth > 0) --depth;
    if (c == ',' && depth == 0) {
      items.push_back(trim(text.substr(start, i - start)));
      start = i + 1;
    }
  }
  if (depth != 0) throw ParseError(fmt::format("allocator options: \"{}\": a '[' is not closed", trim(text)));
  return items;
}

// PyTorch's keys that have no stowage counterpart: accepted, ignored, and said so. Every key
// CUDAAllocatorConfig::parseArgs and AcceleratorAllocatorConfig accept (the ROCm spellings too,
// which PyTorch takes on CUDA as well).
constexpr std::string_view kPytorchOnlyKeys[] = {
    "roundup_power2_divisions",       "max_non_split_rounding_mb",   "backend",
    "release_lock_on_cudamalloc",     "release_lock_on_hipmalloc",   "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",   "pinned_num_register_threads", "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb", "pinned_free_catch_all",       "graph_capture_record_stream_reuse",
    "throw_on_cudamalloc_oom",        "expandable_segments_reserve", "expandable_segments_reserve_by_class"};

}  // namespace

AllocatorOptions parse_allocator_options(const std::string& text, AllocatorOptions base,
                                         std::vector<std::string>* warnings) {
  AllocatorOptions o = base;  // filled in a copy so bad text changes nothing
  std::vector<std::string> said;
  for (const std::string& item : split_items(text)) {
    if (item.empty()) continue;
    const auto colon = item.find(':');
    if (colon == std::string::npos) {
      throw ParseError(fmt::format("allocator options: \"{}\": expected key:value", item));
    }
    const std::string key = trim(std::string_view(item).substr(0, colon));
    const std::string value = trim(std::string_view(item).substr(colon + 1));
    if (key == "expandable_segments") {
      o.segments = parse_bool(key, value) ? SegmentMode::expandable : SegmentMode::classic;
    } else if (key == "max_split_size_mb") {
      const std::uint64_t mib = parse_count(key, value);
      if (mib != 0 && mib <= 20) {  // 20 MiB segments must stay splittable (0: no limit)
        throw ParseError(fmt::format("allocator options: {}: must be 0 (no limit) or above 20, got {}", key, mib));
      }
      o.max_split_size = mib_to_bytes(key, mib);
    } else if (key == "garbage_collection_threshold") {
      o.gc_threshold = parse_fraction(key, value);
      if (o.gc_threshold == 0.0 || o.gc_threshold == 1.0)  // PyTorch: "set it 0.0~1.0", both ends refused
        throw ParseError(fmt::format("allocator options: {}: must lie strictly between 0 and 1, got {}", key, value));
    } else if (key == "memory_cap_mb") {
      o.memory_cap_bytes = mib_to_bytes(key, parse_count(key, value));
    } else if (key == "memory_cap_fraction") {
      o.memory_cap_fraction = parse_fraction(key, value);
    } else if (key == "per_process_memory_fraction") {
      // PyTorch's meaning: 1 (its default) is no cap, 0 a cap no reservation fits: the smallest
      // normal fraction, which caps at one byte (memory_cap_fraction 0 means none). One field, so
      // the last of these keys wins, as in PyTorch.
      const double f = parse_fraction(key, value);
      o.memory_cap_fraction = f == 1.0 ? 0.0 : f == 0.0 ? std::numeric_limits<double>::min() : f;
    } else if (key == "trace_entries") {
      o.trace_entries = static_cast<std::size_t>(parse_count(key, value));
    } else if (key == "expandable_reserve_mb") {
      o.expandable_reserve = mib_to_bytes(key, parse_count(key, value));
    } else if (key == "thread_cache_mb") {
      o.thread_cache_bytes = mib_to_bytes(key, parse_count(key, value));
    } else if (key == "thread_cache_max_block_kb") {
      const std::uint64_t kib = parse_count(key, value);
      if (kib > (std::uint64_t{1} << 30))
        throw ParseError(fmt::format("allocator options: {}: {} KiB is too large", key, kib));
      o.thread_cache_max_block = static_cast<std::size_t>(kib) << 10;
    } else if (std::find(std::begin(kPytorchOnlyKeys), std::end(kPytorchOnlyKeys), key) != std::end(kPytorchOnlyKeys)) {
      said.push_back(
          fmt::format("allocator options: {}:{} is PyTorch's own setting; stowage has no such knob and "
                      "ignores it",
                      key, value));
    } else {
      throw ParseError(
          fmt::format("allocator options: unknown key \"{}\" (known: expandable_segments, max_split_size_mb, "
                      "garbage_collection_threshold, memory_cap_mb, memory_cap_fraction, trace_entries, "
                      "expandable_reserve_mb, thread_cache_mb, thread_cache_max_block_kb; and PyTorch's "
                      "per_process_memory_fraction, roundup_power2_divisions, backend, ...)",
                      key));
    }
  }
  if (warnings != nullptr) warnings->insert(warnings->end(), said.begin(), said.end());
  return o;
}

}  // namespace stowage
