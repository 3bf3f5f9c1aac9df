#include "offload/extent_hooks.hpp"

#include <dlfcn.h>

#include <cstring>

namespace stowage::offload {
namespace {

ExtentSource& source_of(extent_hooks_t* h) { return *reinterpret_cast<ArenaHooks*>(h)->source; }

void* hook_alloc(extent_hooks_t* h, void* new_addr, size_t size, size_t alignment, bool* zero, bool* commit, unsigned) {
  if (new_addr != nullptr) return nullptr;  // in-place growth: not offered
  void* p = source_of(h).map(size, alignment);
  if (p) {
    *zero = true;  // fresh anonymous pages
    *commit = true;
  }
  return p;
}

bool hook_dalloc(extent_hooks_t* h, void* addr, size_t size, bool, unsigned) {
  return !source_of(h).unmap_whole(addr, size);  // true: refused, jemalloc retains it
}

void hook_destroy(extent_hooks_t* h, void* addr, size_t size, bool, unsigned) { source_of(h).return_piece(addr, size); }

bool hook_commit(extent_hooks_t*, void*, size_t, size_t, size_t, unsigned) {
  return false;  // pages are never decommitted, so they are committed already
}

bool hook_decommit(extent_hooks_t*, void*, size_t, size_t, size_t, unsigned) { return true; }

bool hook_split(extent_hooks_t*, void*, size_t, size_t, size_t, bool, unsigned) { return false; }

bool hook_merge(extent_hooks_t* h, void* a, size_t size_a, void* b, size_t size_b, bool, unsigned) {
  return !source_of(h).same_chunk(a, size_a, b, size_b);  // never across two pinned chunks
}

template <class F>
F lookup(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_DEFAULT, name));
}

JemallocApi resolve() {
  JemallocApi api;
  api.alloc = lookup<decltype(api.alloc)>("mallocx");
  api.dalloc = lookup<decltype(api.dalloc)>("dallocx");
  api.nalloc = lookup<decltype(api.nalloc)>("nallocx");
  api.ctl = lookup<decltype(api.ctl)>("mallctl");
  if (!api.alloc || !api.dalloc || !api.nalloc || !api.ctl) return {};
  const char* version = nullptr;
  std::size_t len = sizeof(version);
  if (api.ctl("version", &version, &len, nullptr, 0) != 0 || !version || std::strncmp(version, "5.", 2) != 0) return {};
  return api;
}

}  // namespace

const JemallocApi* JemallocApi::in_process() {
  static const JemallocApi api = resolve();
  return api.alloc ? &api : nullptr;
}

void init_arena_hooks(ArenaHooks& h, ExtentSource& source) {
  h.source = &source;
  h.hooks.alloc = hook_alloc;
  h.hooks.dalloc = hook_dalloc;
  h.hooks.destroy = hook_destroy;
  h.hooks.commit = hook_commit;
  h.hooks.decommit = hook_decommit;
  h.hooks.purge_lazy = nullptr;
  h.hooks.purge_forced = nullptr;
  h.hooks.split = hook_split;
  h.hooks.merge = hook_merge;
}

}  // namespace stowage::offload
