// The host pool's jemalloc backend: a dedicated arena (arenas.create with ArenaHooks), used with
// MALLOCX_ARENA | MALLOCX_TCACHE_NONE so no thread cache holds pinned blocks. Decay is off for
// the arena: pages are purged (unpinned) only by release_unused, never on the hot path.
#include <fmt/format.h>
#include <sys/types.h>

#include <mutex>
#include <string>

#include "common/log.hpp"
#include "offload/extent_hooks.hpp"
#include "offload/host_backend.hpp"

namespace stowage::offload {
namespace {

// jemalloc grows an arena in page-size classes from 2 MiB up; capping the growth there keeps
// pinned chunks close to what is asked.
constexpr std::size_t kRetainGrowLimit = std::size_t{2} << 20;

class JemallocBackend final : public HostBackend {
 public:
  JemallocBackend(ExtentSource& source, const JemallocApi& api) : api_(api) { init_arena_hooks(hooks_, source); }

  ~JemallocBackend() override {
    std::lock_guard lock(mutex_);
    destroy_arena_locked();
  }

  const char* name() const override { return "jemalloc"; }
  std::size_t rounded_size(std::size_t bytes) const override { return api_.nalloc(bytes, 0); }

  void* allocate(std::size_t bytes) override {
    unsigned arena = 0;
    {
      std::lock_guard lock(mutex_);
      if (!have_arena_) create_arena_locked();
      arena = arena_;
    }
    return api_.alloc(bytes, MALLOCX_ARENA(arena) | MALLOCX_TCACHE_NONE);
  }

  void deallocate(void* ptr, std::size_t) override { api_.dalloc(ptr, MALLOCX_TCACHE_NONE); }

  void release_unused(bool empty) override {
    std::lock_guard lock(mutex_);
    if (!have_arena_) return;
    // Whole free extents go back through the dalloc hook; with no live block the arena goes,
    // and with it every retained piece (the destroy hook).
    ctl_or_log(fmt::format("arena.{}.purge", arena_));
    if (empty) destroy_arena_locked();
  }

 private:
  void create_arena_locked() {
    extent_hooks_t* hooks = &hooks_.hooks;
    std::size_t len = sizeof(arena_);
    // mallctl takes the address of the hooks pointer and that pointer's size.
    if (api_.ctl("arenas.create", &arena_, &len, &hooks, sizeof(hooks)) != 0)  // NOLINT(bugprone-sizeof-expression)
      throw OutOfMemory("host pool: jemalloc refused to create an arena (arenas.create)");
    have_arena_ = true;
    ssize_t never = -1;
    ctl_or_log(fmt::format("arena.{}.dirty_decay_ms", arena_), &never, sizeof(never));
    ctl_or_log(fmt::format("arena.{}.muzzy_decay_ms", arena_), &never, sizeof(never));
    std::size_t limit = kRetainGrowLimit;
    ctl_or_log(fmt::format("arena.{}.retain_grow_limit", arena_), &limit, sizeof(limit));
  }

  void destroy_arena_locked() {
    if (!have_arena_) return;
    ctl_or_log(fmt::format("arena.{}.destroy", arena_));
    have_arena_ = false;
  }

  void ctl_or_log(const std::string& name, void* value = nullptr, std::size_t len = 0) {
    if (int err = api_.ctl(name.c_str(), nullptr, nullptr, value, len); err != 0)
      log().warn("host pool: mallctl {} failed ({})", name, err);
  }

  const JemallocApi& api_;
  ArenaHooks hooks_;
  std::mutex mutex_;
  unsigned arena_ = 0;
  bool have_arena_ = false;
};

}  // namespace

std::unique_ptr<HostBackend> make_jemalloc_backend(ExtentSource& source) {
  const JemallocApi* api = JemallocApi::in_process();
  if (!api) return nullptr;
  return std::make_unique<JemallocBackend>(source, *api);
}

}  // namespace stowage::offload
