// The pickle reader and the PyTorch snapshot conversion on arbitrary bytes: every input ends in
// a snapshot that passed the consistency checks or in a ParseError; never a crash, a hang or an
// unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <string>

#include "stowage/error.hpp"
#include "tools/inspect/pickle_reader.hpp"
#include "tools/inspect/pytorch_snapshot.hpp"
#include "tools/inspect/snapshot_analysis.hpp"
#include "tools/inspect/snapshot_consistency.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace stowage;
  try {
    const nlohmann::json j = inspect::read_pickle(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    if (inspect::is_pytorch_snapshot(j)) {
      const Snapshot s = inspect::snapshot_from_pytorch(j, "fuzz");
      if (inspect::inconsistencies(s).empty()) (void)inspect::analyze(s, 5);
    }
    (void)inspect::write_pickle(j);
  } catch (const ParseError&) {
  }
  return 0;
}
