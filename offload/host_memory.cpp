#include "offload/host_memory.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

namespace stowage::offload {
namespace {

std::optional<unsigned long long> read_number(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return std::nullopt;
  unsigned long long v = 0;
  const bool ok = std::fscanf(f, "%llu", &v) == 1;  // "max" (no limit) reads as nothing
  std::fclose(f);
  return ok ? std::optional(v) : std::nullopt;
}

// The process's cgroup directory under the hierarchy, from /proc/self/cgroup ("0::/path" in v2,
// "N:memory:/path" in v1).
std::optional<std::string> cgroup_path(bool v2) {
  FILE* f = std::fopen("/proc/self/cgroup", "r");
  if (f == nullptr) return std::nullopt;
  char line[1024];
  std::optional<std::string> found;
  while (!found && std::fgets(line, sizeof line, f) != nullptr) {
    std::string s(line);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    const auto a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = s.substr(a + 1, b - a - 1);
    const bool match = v2 ? s.compare(0, a, "0") == 0 && controllers.empty()
                          : (controllers == "memory" || controllers.find("memory,") == 0 ||
                             controllers.find(",memory") != std::string::npos);
    if (match) found = s.substr(b + 1);
  }
  std::fclose(f);
  return found;
}

// What the memory cgroup lets this process add, when it has a limit.
std::optional<unsigned long long> cgroup_headroom() {
  if (auto p = cgroup_path(true)) {
    const std::string dir = "/sys/fs/cgroup" + *p;
    const auto limit = read_number(dir + "/memory.max"), used = read_number(dir + "/memory.current");
    if (limit && used) return *limit > *used ? *limit - *used : 0;
  }
  if (auto p = cgroup_path(false)) {
    const std::string dir = "/sys/fs/cgroup/memory" + *p;
    const auto limit = read_number(dir + "/memory.limit_in_bytes"), used = read_number(dir + "/memory.usage_in_bytes");
    if (limit && used) return *limit > *used ? *limit - *used : 0;  // "no limit" is a huge number
  }
  return std::nullopt;
}

}  // namespace

std::size_t host_memory_available() {
  unsigned long long bytes = 0;
  bool found = false;
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kib = 0;
    while (!found && std::fgets(line, sizeof line, f) != nullptr)
      found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    std::fclose(f);
    if (found) bytes = kib * 1024ULL;
  }
  if (!found)
    bytes = static_cast<unsigned long long>(sysconf(_SC_PHYS_PAGES)) *
            static_cast<unsigned long long>(sysconf(_SC_PAGESIZE));
  if (const auto room = cgroup_headroom()) bytes = std::min(bytes, *room);
  return static_cast<std::size_t>(bytes);
}

}  // namespace stowage::offload
