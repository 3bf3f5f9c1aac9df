#pragma once
// How every C ABI entry point turns C++ errors into a return value plus the thread's last error
// (stowage.h): no exception crosses into a C or Python caller.
#include <exception>

#include "stowage/stowage.h"

namespace stowage::capi {

// Hidden: not part of the library's interface, so the compiler may inline them into the entry
// points (an exported function could be interposed and is always called through the PLT).
[[gnu::visibility("hidden")]] void clear_error() noexcept;
[[gnu::visibility("hidden")]] int code_of(const std::exception& e);
// Sets the thread's last error; the first failure of the process also goes to stderr.
[[gnu::visibility("hidden")]] void fail(const char* message, int code) noexcept;

// Runs f, turning any exception into `on_error` plus the thread's last error.
template <class R, class F>
R guarded(R on_error, F&& f) noexcept {
  try {
    clear_error();
    return f();
  } catch (const std::exception& e) {
    fail(e.what(), code_of(e));
  } catch (...) {
    fail("unknown error", STOWAGE_ERROR_OTHER);
  }
  return on_error;
}

}  // namespace stowage::capi
