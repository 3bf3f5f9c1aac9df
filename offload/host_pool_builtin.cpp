// The host pool's built-in backend, used when jemalloc is not in the process (a framework that
// dlopens libstowage.so, sanitizer builds) or when asked for. Size classes, 4 per doubling;
// classes up to 256 KiB are carved from 2 MiB slabs, larger ones get an extent each. Free blocks
// stay pinned in per-class lists, so reuse costs no system call.
#include <algorithm>
#include <bit>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "offload/host_backend.hpp"

namespace stowage::offload {
namespace {

constexpr std::size_t kMinClass = 256;
constexpr std::size_t kLargestSlabClass = std::size_t{256} << 10;
constexpr std::size_t kSlabBytes = std::size_t{2} << 20;

std::size_t size_class(std::size_t n) {
  if (n <= kMinClass) return kMinClass;
  const int p = std::bit_width(n - 1);  // 2^p >= n > 2^(p-1)
  const std::size_t step = std::size_t{1} << (p - 3);
  return (n + step - 1) & ~(step - 1);
}

class BuiltinBackend final : public HostBackend {
 public:
  explicit BuiltinBackend(ExtentSource& source) : source_(source) {}

  const char* name() const override { return "builtin"; }
  std::size_t rounded_size(std::size_t bytes) const override { return size_class(bytes); }

  void* allocate(std::size_t bytes) override {
    const std::size_t cls = size_class(bytes);
    std::lock_guard lock(mutex_);
    auto& list = free_[cls];
    if (list.empty() && !refill_locked(cls, list)) return nullptr;
    void* p = list.back();
    list.pop_back();
    if (cls <= kLargestSlabClass) ++slab_of_locked(p)->second.live;
    return p;
  }

  void deallocate(void* ptr, std::size_t bytes) override {
    const std::size_t cls = size_class(bytes);
    std::lock_guard lock(mutex_);
    if (cls <= kLargestSlabClass) --slab_of_locked(ptr)->second.live;
    free_[cls].push_back(ptr);
  }

  void release_unused(bool) override {
    std::lock_guard lock(mutex_);
    for (auto& [cls, list] : free_) {
      if (cls > kLargestSlabClass) {
        // a copy: clang before 16 cannot capture a structured binding
        std::erase_if(list, [&, cls = cls](void* p) { return source_.unmap_whole(p, cls); });
        continue;
      }
      for (auto it = slabs_.begin(); it != slabs_.end();) {
        if (it->second.cls != cls || it->second.live != 0) {
          ++it;
          continue;
        }
        const std::uintptr_t lo = it->first, hi = lo + kSlabBytes;
        std::erase_if(list, [&](void* p) {
          const auto a = reinterpret_cast<std::uintptr_t>(p);
          return a >= lo && a < hi;
        });
        source_.unmap_whole(reinterpret_cast<void*>(lo), kSlabBytes);
        it = slabs_.erase(it);
      }
    }
  }

 private:
  struct Slab {
    std::size_t cls = 0;
    std::size_t live = 0;
  };

  bool refill_locked(std::size_t cls, std::vector<void*>& list) {
    if (cls > kLargestSlabClass) {
      void* p = source_.map(cls, 4096);
      if (!p) return false;
      list.push_back(p);
      return true;
    }
    void* base = source_.map(kSlabBytes, 4096);
    if (!base) return false;
    slabs_[reinterpret_cast<std::uintptr_t>(base)] = Slab{cls, 0};
    const std::size_t n = kSlabBytes / cls;
    // Pushed in reverse so blocks are handed out in address order.
    for (std::size_t i = n; i-- > 0;) list.push_back(static_cast<char*>(base) + i * cls);
    return true;
  }

  std::map<std::uintptr_t, Slab>::iterator slab_of_locked(const void* p) {
    auto it = slabs_.upper_bound(reinterpret_cast<std::uintptr_t>(p));
    return --it;  // HostPool only passes blocks this backend handed out
  }

  ExtentSource& source_;
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::map<std::uintptr_t, Slab> slabs_;
};

}  // namespace

std::unique_ptr<HostBackend> make_builtin_backend(ExtentSource& source) {
  return std::make_unique<BuiltinBackend>(source);
}

}  // namespace stowage::offload
