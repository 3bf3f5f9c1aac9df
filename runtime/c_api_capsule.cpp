// The PyCapsule destructor of the DLPack capsules the Python package makes. A consumer that refuses
// a capsule (say, a dtype it lacks) drops it with its own exception pending; a destructor written in
// Python cannot run then (CPython reports "returned a result with an exception set" and the memory
// stays taken). This one is C and touches no Python error state. It resolves the two PyCapsule calls
// it needs in the running interpreter, so libstowage links no libpython.
#include <dlfcn.h>

#include <dlpack/dlpack.h>

#include "stowage/stowage.h"

namespace {

using IsValid = int (*)(void*, const char*);
using GetPointer = void* (*)(void*, const char*);

constexpr const char* kUnconsumed = "dltensor";  // a consumer renames the capsule "used_dltensor"

}  // namespace

extern "C" {

void stowage_dlpack_capsule_destructor(void* capsule) {
  // NOLINTBEGIN(cppcoreguidelines-pro-type-reinterpret-cast): symbols found by name
  static const auto is_valid = reinterpret_cast<IsValid>(::dlsym(RTLD_DEFAULT, "PyCapsule_IsValid"));
  static const auto get_pointer = reinterpret_cast<GetPointer>(::dlsym(RTLD_DEFAULT, "PyCapsule_GetPointer"));
  // NOLINTEND(cppcoreguidelines-pro-type-reinterpret-cast)
  if (capsule == nullptr || is_valid == nullptr || get_pointer == nullptr || is_valid(capsule, kUnconsumed) == 0)
    return;
  auto* managed = static_cast<DLManagedTensor*>(get_pointer(capsule, kUnconsumed));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

}  // extern "C"
