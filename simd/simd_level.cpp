// Picks the host kernels' instruction-set level once: the best the CPU has, lowered by
// STOWAGE_SIMD or set_simd_level(). Every CPU kernel (precision, recompute) dispatches on it.
#include "stowage/simd_level.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "stowage/error.hpp"

namespace stowage {
namespace {

SimdLevel detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return SimdLevel::avx512;
  if (__builtin_cpu_supports("avx2")) return SimdLevel::avx2;
#endif
  return SimdLevel::scalar;
}

SimdLevel initial_level() {
  const SimdLevel best = detect();
  const char* env = std::getenv("STOWAGE_SIMD");
  if (!env || !*env) return best;
  const std::string s = env;
  SimdLevel want = best;
  // Every level computes the same bits, so a value that cannot be had keeps the detected level;
  // said on stderr whatever the log level, as the configuration's other warnings are.
  if (s == "scalar") want = SimdLevel::scalar;
  else if (s == "avx2") want = SimdLevel::avx2;
  else if (s == "avx512") want = SimdLevel::avx512;
  else
    std::fprintf(stderr, "stowage: STOWAGE_SIMD=%s is not scalar, avx2 or avx512; using %s\n", s.c_str(),
                 to_string(best));
  if (static_cast<int>(want) > static_cast<int>(best)) {
    std::fprintf(stderr, "stowage: STOWAGE_SIMD=%s: this CPU supports up to %s; using %s\n", s.c_str(), to_string(best),
                 to_string(best));
    want = best;
  }
  return want;
}

std::atomic<int>& level_slot() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}

}  // namespace

const char* to_string(SimdLevel level) {
  switch (level) {
    case SimdLevel::scalar: return "scalar";
    case SimdLevel::avx2: return "avx2";
    case SimdLevel::avx512: return "avx512";
  }
  return "?";
}

SimdLevel detected_simd_level() {
  static const SimdLevel best = detect();
  return best;
}

SimdLevel simd_level() { return static_cast<SimdLevel>(level_slot().load(std::memory_order_relaxed)); }

void set_simd_level(SimdLevel level) {
  if (static_cast<int>(level) < 0 || static_cast<int>(level) > static_cast<int>(detected_simd_level())) {
    throw Unsupported(fmt::format("SIMD level {} is not supported by this CPU (best: {})",
                                  static_cast<int>(level) <= 2 ? to_string(level) : "?",
                                  to_string(detected_simd_level())));
  }
  level_slot().store(static_cast<int>(level), std::memory_order_relaxed);
}

}  // namespace stowage
