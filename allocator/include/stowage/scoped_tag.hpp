#pragma once
// Tags for allocations: every block records the tag current on its thread when it was allocated,
// so snapshots and `stowage inspect` can say what the memory is for.
#include <string>

namespace stowage {

// Sets the tag recorded with every allocation made on this thread while it lives
// (e.g. "layer3.attn"); nests, restoring the outer tag on destruction. Tags on one thread end in
// the reverse order of their start, as scopes do.
class ScopedTag {
 public:
  explicit ScopedTag(std::string tag);
  ~ScopedTag();
  ScopedTag(const ScopedTag&) = delete;
  ScopedTag& operator=(const ScopedTag&) = delete;
  static const std::string& current();

 private:
  std::string tag_;
  const std::string* previous_;
};

}  // namespace stowage
