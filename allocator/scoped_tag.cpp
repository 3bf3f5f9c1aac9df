// The thread's current allocation tag, set by nested ScopedTag objects.
#include "stowage/scoped_tag.hpp"

#include <fmt/format.h>

#include "common/fatal.hpp"

namespace stowage {
namespace {

// The innermost ScopedTag of the thread; nullptr for none. A plain pointer: a thread-local with no
// constructor or destructor is one access on the allocation hot path.
thread_local ScopedTag* innermost = nullptr;

}  // namespace

ScopedTag::ScopedTag(std::string tag) : tag_(std::move(tag)), previous_(innermost), home_(&innermost) {
  innermost = this;
}

ScopedTag::~ScopedTag() {
  if (home_ != &innermost) {
    // Its thread's chain cannot be mended from here (that thread may be reading it right now).
    detail::fatal(
        fmt::format("ScopedTag \"{}\" destroyed on another thread than the one that made it; a tag must end on its own "
                    "thread (its thread's current tag would name freed memory)",
                    tag_));
  }
  if (innermost == this) {
    innermost = previous_;
    return;
  }
  // Ended before a tag nested in it: out of the chain, so no tag is left naming it.
  for (ScopedTag* t = innermost; t != nullptr; t = t->previous_) {
    if (t->previous_ == this) {
      t->previous_ = previous_;
      return;
    }
  }
}

const std::string& ScopedTag::current() {
  static const std::string& none = *new std::string();  // leaked: allocations in static destructors read it
  const ScopedTag* t = innermost;
  return t != nullptr ? t->tag_ : none;
}

}  // namespace stowage
