#include "common/thread_exit_key.hpp"

#include <dlfcn.h>

#include <new>

namespace stowage {

pthread_key_t make_thread_exit_key(void (*destructor)(void*)) {
  pthread_key_t key{};
  if (pthread_key_create(&key, destructor) != 0) throw std::bad_alloc();
  Dl_info where{};
  if (dladdr(reinterpret_cast<void*>(destructor), &where) != 0 && where.dli_fname != nullptr)
    (void)dlopen(where.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
  return key;
}

}  // namespace stowage
