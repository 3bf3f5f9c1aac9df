#pragma once
// A pthread key whose destructor ends a thread's per-thread state. glibc runs pthread key
// destructors after the C++ thread_local ones, and runs again (up to four rounds) for a key set
// during them, so state made on first use — even by a client's own key destructor at thread
// exit — is still ended, where a thread_local made that late is never destroyed (and leaks).
#include <pthread.h>

namespace stowage {

// A new key with `destructor`, whose code stays mapped for as long as the process lives: the
// destructor runs at every later thread exit (libstowage.so is -z nodelete; a plugin embedding
// the static library is pinned here, or its dlclose would leave glibc calling unmapped code).
// std::bad_alloc when no key is left.
pthread_key_t make_thread_exit_key(void (*destructor)(void*));

}  // namespace stowage
