#pragma once
// jemalloc, found at run time, and the extent hooks that make one of its arenas draw pinned,
// NUMA-bound pages from an ExtentSource. libstowage.so never links or dlopen's jemalloc
// (Debian's libjemalloc.so.2 cannot be dlopen'ed: static TLS); it uses jemalloc only when the
// executable already has it, looked up with dlsym(RTLD_DEFAULT, ...). docs/host_pool.md.
#include <jemalloc/jemalloc.h>

#include <cstddef>

#include "offload/extent_source.hpp"

namespace stowage::offload {

struct JemallocApi {
  void* (*alloc)(std::size_t, int) = nullptr;                                  // mallocx
  void (*dalloc)(void*, int) = nullptr;                                        // dallocx
  std::size_t (*nalloc)(std::size_t, int) = nullptr;                           // nallocx
  int (*ctl)(const char*, void*, std::size_t*, void*, std::size_t) = nullptr;  // mallctl
  // The process's jemalloc (version 5.x, whose extent hooks this code speaks), or nullptr.
  static const JemallocApi* in_process();
};

// extent_hooks_t first, so jemalloc's hooks pointer leads back to the source.
struct ArenaHooks {
  extent_hooks_t hooks{};
  ExtentSource* source = nullptr;
};

// Fills `h` with hooks that map extents from `source`. Unpinning is all-or-nothing per mapped
// chunk: dalloc accepts only whole chunks (others stay retained by jemalloc, pinned and
// reusable), destroy takes pieces back until a chunk is complete; decommit and purge are refused
// so pinned pages are never dropped under a registration.
void init_arena_hooks(ArenaHooks& h, ExtentSource& source);

}  // namespace stowage::offload
