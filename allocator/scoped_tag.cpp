// The thread's current allocation tag, set by nested ScopedTag objects.
#include "stowage/scoped_tag.hpp"

namespace stowage {
namespace {

// The innermost ScopedTag's tag; nullptr for none. A plain pointer: a thread-local with no
// constructor or destructor is one access on the allocation hot path.
thread_local const std::string* current_tag = nullptr;

}  // namespace

ScopedTag::ScopedTag(std::string tag) : tag_(std::move(tag)), previous_(current_tag) { current_tag = &tag_; }

ScopedTag::~ScopedTag() { current_tag = previous_; }

const std::string& ScopedTag::current() {
  static const std::string none;
  const std::string* tag = current_tag;
  return tag != nullptr ? *tag : none;
}

}  // namespace stowage
