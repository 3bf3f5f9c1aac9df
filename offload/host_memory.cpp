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

// The value of `key` in a "key value" file (memory.stat), 0 when absent.
unsigned long long stat_value(const std::string& path, const char* key) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return 0;
  char name[128];
  unsigned long long v = 0, found = 0;
  while (std::fscanf(f, "%127s %llu", name, &v) == 2)
    if (std::string(name) == key) found = v;
  std::fclose(f);
  return found;
}

// The cgroup's limit less its working set: usage less the inactive file pages the kernel
// reclaims before it would kill (kubelet's working set). Page cache from reading a dataset is no
// use of memory that keeps a request out.
std::optional<unsigned long long> room_below(std::optional<unsigned long long> limit,
                                             std::optional<unsigned long long> used, unsigned long long inactive_file) {
  if (!limit || !used) return std::nullopt;
  const unsigned long long working = *used > inactive_file ? *used - inactive_file : 0;
  return *limit > working ? *limit - working : 0;  // v1's "no limit" is a huge number
}

// What the memory cgroup lets this process add, when it has a limit.
std::optional<unsigned long long> cgroup_headroom() {
  if (auto p = cgroup_path(true)) {
    const std::string dir = "/sys/fs/cgroup" + *p;
    if (auto room = room_below(read_number(dir + "/memory.max"), read_number(dir + "/memory.current"),
                               stat_value(dir + "/memory.stat", "inactive_file")))
      return room;
  }
  if (auto p = cgroup_path(false)) {
    const std::string dir = "/sys/fs/cgroup/memory" + *p;
    return room_below(read_number(dir + "/memory.limit_in_bytes"), read_number(dir + "/memory.usage_in_bytes"),
                      stat_value(dir + "/memory.stat", "total_inactive_file"));
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

std::optional<std::size_t> node_memory_available(int node) {
  FILE* f = std::fopen(("/sys/devices/system/node/node" + std::to_string(node) + "/meminfo").c_str(), "r");
  if (f == nullptr) return std::nullopt;
  char line[256];
  unsigned long long total = 0, kib = 0;
  int fields = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    int n = 0;
    // "Node 0 MemFree:  123 kB", "Node 0 Active(file): ...", "Node 0 Inactive(file): ..."
    for (const char* key : {"MemFree:", "Active(file):", "Inactive(file):"}) {
      char format[64];
      std::snprintf(format, sizeof format, "Node %%d %s %%llu kB", key);
      if (std::sscanf(line, format, &n, &kib) == 2) total += kib, ++fields;
    }
  }
  std::fclose(f);
  if (fields == 0) return std::nullopt;
  return static_cast<std::size_t>(total * 1024ULL);
}

}  // namespace stowage::offload
