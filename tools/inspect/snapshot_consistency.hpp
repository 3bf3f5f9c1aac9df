#pragma once
// What must hold in any snapshot the allocator writes: a file that breaks it (hand-edited,
// truncated and repaired, written by something else) is refused rather than analysed.
#include <string>
#include <vector>

#include "stowage/snapshot.hpp"

namespace stowage::inspect {

// Each broken invariant, named with where it breaks; empty when the snapshot is consistent.
// Statistics: no negative value, peak >= current, allocated <= reserved. Segments: a classic
// segment's blocks tile [address, address + total_size) in order; an expandable segment's (its
// mapped blocks, holes unlisted) lie in address order from its address, none overlapping the
// one before, sizes adding up to total_size (the bytes mapped). No block ends past the address
// space; a block in use (allocated or pending free) requested at most its size.
std::vector<std::string> inconsistencies(const Snapshot& snapshot);

}  // namespace stowage::inspect
