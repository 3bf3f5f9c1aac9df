// The thread's current allocation tag, set by nested ScopedTag objects.
#include "stowage/scoped_tag.hpp"

namespace stowage {
namespace {

std::string& current_tag() {
  thread_local std::string tag;
  return tag;
}

}  // namespace

ScopedTag::ScopedTag(std::string tag) : previous_(std::move(current_tag())) { current_tag() = std::move(tag); }

ScopedTag::~ScopedTag() { current_tag() = std::move(previous_); }

const std::string& ScopedTag::current() { return current_tag(); }

}  // namespace stowage
