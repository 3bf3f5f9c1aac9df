#pragma once
// Tags for allocations: every block records the tag current on its thread when it was allocated,
// so snapshots and `stowage inspect` can say what the memory is for.
#include <string>

namespace stowage {

// Sets the tag recorded with every allocation made on this thread while it lives
// (e.g. "layer3.attn"); nests, restoring the outer tag on destruction. A tag ends on the thread
// that made it; one that ends before a tag nested in it (a stack of them unwound front to back)
// just leaves the nest. Destroyed on another thread it would leave its own thread's tag pointing
// at freed memory: that ends the process with a message saying so (a destructor cannot throw).
// So a ScopedTag is a scope's object, never one of static storage (exit() on another thread
// would destroy it there).
class ScopedTag {
 public:
  explicit ScopedTag(std::string tag);
  ~ScopedTag();
  ScopedTag(const ScopedTag&) = delete;
  ScopedTag& operator=(const ScopedTag&) = delete;
  static const std::string& current();

 private:
  std::string tag_;
  ScopedTag* previous_;  // the tag it nests in on its thread
  ScopedTag** home_;     // that thread's innermost-tag slot: tells the thread a tag belongs to
};

}  // namespace stowage
