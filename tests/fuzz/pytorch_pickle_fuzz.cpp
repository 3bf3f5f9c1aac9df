// The pickle reader and the PyTorch snapshot conversion on arbitrary bytes: every input ends in
// a snapshot that passed the consistency checks or in a ParseError; never a crash, a hang or an
// unbounded allocation. Read twice: in full, and with PyTorch's "frames" selector (one frame per
// distinct frames list); the selector must agree with the full reading on every block's tag, and
// a selector that keeps every item must read exactly like no selector.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "stowage/error.hpp"
#include "tools/inspect/pickle_reader.hpp"
#include "tools/inspect/pytorch_snapshot.hpp"
#include "tools/inspect/snapshot_analysis.hpp"
#include "tools/inspect/snapshot_consistency.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace stowage;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  nlohmann::json full;
  bool read = false;
  try {
    full = inspect::read_pickle(bytes, "fuzz");
    read = true;
    if (inspect::is_pytorch_snapshot(full) || full.is_array()) {
      const Snapshot s = inspect::snapshot_from_pytorch(full, "fuzz");
      if (inspect::inconsistencies(s).empty()) (void)inspect::analyze(s, 5);
    }
    (void)inspect::write_pickle(full);
  } catch (const ParseError&) {
  }
  try {
    const nlohmann::json selected = inspect::read_pytorch_pickle(bytes, "fuzz");
    if (inspect::is_pytorch_snapshot(selected) || selected.is_array()) {
      const Snapshot s = inspect::snapshot_from_pytorch(selected, "fuzz");
      if (read) {  // the same tags from the selected frames as from all of them
        const Snapshot f = inspect::snapshot_from_pytorch(full, "fuzz");
        for (std::size_t i = 0; i < s.segments.size(); ++i)
          for (std::size_t k = 0; k < s.segments[i].blocks.size(); ++k)
            if (s.segments[i].blocks[k].tag != f.segments.at(i).blocks.at(k).tag) std::abort();
      }
    }
  } catch (const ParseError&) {
  }
  if (read) {
    const inspect::ListSelector all{"frames", [](std::size_t n, const auto& item) {
                                      std::vector<std::size_t> keep;
                                      for (std::size_t i = 0; i < n; ++i) {
                                        (void)item(i);
                                        keep.push_back(i);
                                      }
                                      return keep;
                                    }};
    try {
      if (inspect::read_pickle(bytes, "fuzz", &all) != full) std::abort();
    } catch (const ParseError&) {  // a copy counted twice may pass the budget: refused, never wrong
    }
  }
  return 0;
}
