// HostPool: picks a backend, checks requests, and keeps the books (live buffers, in-use bytes per
// node, the cap). Pages, binding and pinning are the ExtentSource's business.
#include "stowage/host_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>

#include "common/fork_generation.hpp"
#include "common/log.hpp"
#include "offload/extent_hooks.hpp"
#include "offload/host_backend.hpp"
#include "offload/host_memory.hpp"

namespace stowage {
namespace {

constexpr std::size_t kLargestRequest = std::size_t{1} << 46;  // 64 TiB: more is refused as it is

// The nodes to bind to: the caller's (each must exist), else the device's nearest that exist.
std::vector<int> binding_nodes(const Device& device, const HostPoolOptions& o) {
  const std::vector<int> present = offload::numa_nodes_present();
  auto exists = [&](int n) { return std::find(present.begin(), present.end(), n) != present.end(); };
  for (int n : o.numa_nodes)
    if (!exists(n))
      throw InvalidArgument(
          fmt::format("host pool: NUMA node {} does not exist here ({} node(s) present)", n, present.size()));
  std::vector<int> nodes = o.numa_nodes.empty() ? device.properties().numa_nodes : o.numa_nodes;
  std::erase_if(nodes, [&](int n) { return !exists(n); });
  return nodes;
}

}  // namespace

const char* to_string(HostPoolBackend backend) {
  switch (backend) {
    case HostPoolBackend::automatic: return "automatic";
    case HostPoolBackend::jemalloc: return "jemalloc";
    case HostPoolBackend::builtin: return "builtin";
  }
  return "?";
}

bool jemalloc_in_process() { return offload::JemallocApi::in_process() != nullptr; }

struct HostPool::Impl {
  struct Live {
    std::size_t requested = 0, rounded = 0;
    int node = -1;
  };

  Impl(Device& d, HostPoolOptions o, const void* pool)
      : device(d),
        use(d.attach(fmt::format("HostPool {}", fmt::ptr(pool)))),
        options(std::move(o)),
        source(d, binding_nodes(d, options), options.cap_bytes, options.pin) {
    if (options.backend != HostPoolBackend::builtin) backend = offload::make_jemalloc_backend(source);
    if (!backend && options.backend == HostPoolBackend::jemalloc)
      throw Unsupported(
          "host pool: jemalloc is not in this process (link the executable with -ljemalloc, "
          "or use HostPoolBackend::builtin); see docs/host_pool.md");
    kind = backend ? HostPoolBackend::jemalloc : HostPoolBackend::builtin;
    if (!backend) backend = offload::make_builtin_backend(source);
  }

  std::string oom_message(std::size_t bytes, std::size_t rounded) const {
    const auto c = source.counters();
    return fmt::format(
        "host pool: cannot allocate {} bytes ({} with rounding): cap {}, pinned {}, in use {} in {} buffer(s). "
        "Free buffers, call release_unused(), or raise HostPoolOptions::cap_bytes.",
        bytes, rounded, options.cap_bytes ? fmt::format("{} bytes", options.cap_bytes) : std::string("none"),
        c.pinned_bytes, in_use, live.size());
  }

  // Every operation's first step, before the lock: in a process forked from the one that made
  // the pool the lock may be held for ever by a parent's thread, and the pages are pinned for
  // the parent's device.
  void check_not_forked(const char* what) const {
    if (forked_since(generation)) [[unlikely]]
      refuse_in_forked_child(fmt::format("host pool: {}", what));
  }

  unsigned generation = fork_generation();  // the process the pool was made in
  Device& device;
  Dependency use;         // on the device; declared before the source: released after the pages are given back
  Dependents dependents;  // swap schedulers and optimizers holding buffers of this pool
  HostPoolOptions options;
  offload::ExtentSource source;  // declared before the backend: outlives it
  std::unique_ptr<offload::HostBackend> backend;
  HostPoolBackend kind = HostPoolBackend::builtin;

  mutable std::mutex mutex;
  std::unordered_map<const void*, Live> live;
  std::map<int, std::size_t> in_use_per_node;
  std::size_t in_use = 0, peak_in_use = 0, requested = 0;
  std::uint64_t num_allocs = 0, num_frees = 0, num_ooms = 0;
};

HostPool::HostPool(Device& device, HostPoolOptions options)
    : impl_(std::make_unique<Impl>(device, std::move(options), this)) {}

HostPool::~HostPool() {
  if (forked_since(impl_->generation)) {
    // Its lock may be held by a parent's thread that is not here, and unpinning would ask the
    // parent's device: the pages (the child's copies) are kept until the process ends.
    (void)impl_.release();  // NOLINT(bugprone-unused-return-value): kept on purpose
    return;
  }
  impl_->dependents.check_none_left();
  if (!impl_->live.empty())
    log().warn("host pool: destroyed with {} live buffer(s), {} bytes; their pages are unmapped", impl_->live.size(),
               impl_->in_use);
  impl_->backend.reset();
}

Device& HostPool::device() const { return impl_->device; }
const HostPoolOptions& HostPool::options() const { return impl_->options; }
HostPoolBackend HostPool::backend() const { return impl_->kind; }

Dependency HostPool::attach(std::string what) {
  impl_->check_not_forked("attach");
  return impl_->dependents.add(fmt::format("HostPool {} (device {})", fmt::ptr(this), impl_->device.ordinal()),
                               std::move(what));
}

void* HostPool::allocate(std::size_t bytes) {
  impl_->check_not_forked("allocate");
  if (bytes == 0) return nullptr;
  auto& m = *impl_;
  if (bytes > kLargestRequest) {  // out of memory however large (rounding it could overflow)
    std::lock_guard lock(m.mutex);
    ++m.num_ooms;
    throw OutOfMemory(m.oom_message(bytes, bytes) + " The request is beyond any host memory.");
  }
  const std::size_t rounded = m.backend->rounded_size(bytes);
  std::lock_guard lock(m.mutex);
  if (m.options.cap_bytes != 0 && m.in_use + rounded > m.options.cap_bytes) {
    ++m.num_ooms;
    throw OutOfMemory(m.oom_message(bytes, rounded));
  }
  // A backend refuses with nullptr, or with OutOfMemory when it cannot even set itself up (the
  // jemalloc arena's first pages are pinned too): both are the same refusal here.
  std::string cause;
  auto attempt = [&]() -> void* {
    try {
      return m.backend->allocate(bytes);
    } catch (const OutOfMemory& e) {
      cause = e.what();
      return nullptr;
    }
  };
  void* p = attempt();
  if (!p) {  // the cap or the system refused pages: give back what is cached, try once more
    m.backend->release_unused(m.live.empty());
    p = attempt();
  }
  if (!p) {
    ++m.num_ooms;
    std::string message = m.oom_message(bytes, rounded);
    if (!cause.empty()) message += fmt::format(" Cause: {}", cause);
    message += fmt::format(" The host has {} bytes available.", offload::host_memory_available());
    throw OutOfMemory(message);
  }
  const int node = m.source.node_of(p);
  m.live[p] = Impl::Live{bytes, rounded, node};
  m.in_use += rounded;
  m.peak_in_use = std::max(m.peak_in_use, m.in_use);
  m.requested += bytes;
  m.in_use_per_node[node] += rounded;
  ++m.num_allocs;
  return p;
}

void HostPool::deallocate(void* ptr) {
  if (!ptr) return;
  impl_->check_not_forked("deallocate");
  auto& m = *impl_;
  std::lock_guard lock(m.mutex);
  auto it = m.live.find(ptr);
  if (it == m.live.end())
    throw InvalidArgument(
        fmt::format("host pool: {} is not a live buffer of this pool (foreign pointer or double free)", ptr));
  const Impl::Live l = it->second;
  m.live.erase(it);
  m.backend->deallocate(ptr, l.requested);
  m.in_use -= l.rounded;
  m.requested -= l.requested;
  if (auto n = m.in_use_per_node.find(l.node); (n->second -= l.rounded) == 0) m.in_use_per_node.erase(n);
  ++m.num_frees;
}

bool HostPool::owns(const void* ptr) const {
  impl_->check_not_forked("owns");
  std::lock_guard lock(impl_->mutex);
  return impl_->live.contains(ptr);
}

std::size_t HostPool::usable_size(const void* ptr) const {
  impl_->check_not_forked("usable_size");
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->live.find(ptr);
  if (it == impl_->live.end())
    throw InvalidArgument(fmt::format("host pool: {} is not a live buffer of this pool", ptr));
  return it->second.rounded;
}

int HostPool::node_of(const void* ptr) const {
  impl_->check_not_forked("node_of");
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->live.find(ptr);
  return it == impl_->live.end() ? impl_->source.node_of(ptr) : it->second.node;
}

std::size_t HostPool::release_unused() {
  impl_->check_not_forked("release_unused");
  auto& m = *impl_;
  std::lock_guard lock(m.mutex);
  const std::size_t before = m.source.counters().pinned_bytes;
  m.backend->release_unused(m.live.empty());
  return before - m.source.counters().pinned_bytes;
}

HostPoolStats HostPool::stats() const {
  impl_->check_not_forked("stats");
  const auto& m = *impl_;
  std::lock_guard lock(m.mutex);
  const auto c = m.source.counters();
  HostPoolStats s;
  s.backend = to_string(m.kind);
  s.cap_bytes = m.options.cap_bytes;
  s.pinned_bytes = c.pinned_bytes;
  s.peak_pinned_bytes = c.peak_pinned_bytes;
  s.in_use_bytes = m.in_use;
  s.peak_in_use_bytes = m.peak_in_use;
  s.requested_bytes = m.requested;
  s.live_buffers = m.live.size();
  s.num_allocs = m.num_allocs;
  s.num_frees = m.num_frees;
  s.num_maps = c.num_maps;
  s.num_unmaps = c.num_unmaps;
  s.num_ooms = m.num_ooms;
  s.numa_bound = m.source.numa_bound();
  std::map<int, HostPoolNodeStats> nodes;
  for (auto [node, bytes] : c.pinned_per_node) nodes[node] = {node, bytes, 0};
  for (auto [node, bytes] : m.in_use_per_node) {
    nodes[node].node = node;
    nodes[node].in_use_bytes = bytes;
  }
  for (auto& [node, n] : nodes) s.nodes.push_back(n);
  return s;
}

void HostPool::reset_peak_stats() {
  impl_->check_not_forked("reset_peak_stats");
  std::lock_guard lock(impl_->mutex);
  impl_->peak_in_use = impl_->in_use;
  impl_->source.reset_peak();
}

}  // namespace stowage
