#pragma once
// The host pool's backends: size classes over an ExtentSource. HostPool does the bookkeeping
// (live buffers, in-use bytes, the cap); a backend only hands out and takes back blocks.
#include <cstddef>
#include <memory>

#include "offload/extent_source.hpp"

namespace stowage::offload {

class HostBackend {
 public:
  virtual ~HostBackend() = default;
  virtual const char* name() const = 0;
  // The bytes a request of `bytes` occupies (its size class).
  virtual std::size_t rounded_size(std::size_t bytes) const = 0;
  // A block of rounded_size(bytes); nullptr when the extent source refuses pages.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes) = 0;
  // Gives pages no live block uses back to the extent source. `empty`: no block is live.
  virtual void release_unused(bool empty) = 0;
};

// stowage's own size classes (4 per doubling): small ones carved from 2 MiB slabs, large ones
// one extent each; free blocks are kept per class for reuse.
std::unique_ptr<HostBackend> make_builtin_backend(ExtentSource& source);
// A dedicated jemalloc arena whose extent hooks draw from `source`; nullptr when jemalloc is not
// in the process (resolved with dlsym, never dlopen'ed).
std::unique_ptr<HostBackend> make_jemalloc_backend(ExtentSource& source);

}  // namespace stowage::offload
