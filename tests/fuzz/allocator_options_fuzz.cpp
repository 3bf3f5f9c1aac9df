// Configuration text (STOWAGE_ALLOC_CONF, STOWAGE_FAULTS) on arbitrary bytes: parsed or ParseError.
#include <cstdint>
#include <string>

#include "stowage/allocator.hpp"
#include "stowage/fault_injection.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)stowage::parse_allocator_options(text);
  } catch (const stowage::ParseError&) {
  }
  try {
    (void)stowage::parse_fault_plan(text);
  } catch (const stowage::ParseError&) {
  }
  return 0;
}
