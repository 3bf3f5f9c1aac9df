// The snapshot reader on arbitrary text: ParseError or a snapshot, never a crash; a snapshot it
// accepts writes back to JSON that reads to the same thing.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "stowage/allocator.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const stowage::Snapshot s = stowage::snapshot_from_json(text);
    const std::string again = stowage::to_json(s);
    if (stowage::to_json(stowage::snapshot_from_json(again)) != again) std::abort();
  } catch (const stowage::ParseError&) {
  }
  return 0;
}
