// The thread's current allocation tag, set by nested ScopedTag objects.
#include "stowage/scoped_tag.hpp"

namespace stowage {
namespace {

// The innermost ScopedTag of the thread; nullptr for none. A plain pointer: a thread-local with no
// constructor or destructor is one access on the allocation hot path.
thread_local ScopedTag* innermost = nullptr;

}  // namespace

ScopedTag::ScopedTag(std::string tag) : tag_(std::move(tag)), previous_(innermost) { innermost = this; }

ScopedTag::~ScopedTag() {
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
