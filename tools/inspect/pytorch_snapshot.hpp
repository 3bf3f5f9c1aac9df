#pragma once
// PyTorch's memory snapshot (torch.cuda.memory._snapshot(), pickled by _dump_snapshot, or the
// same dict as JSON) read as a stowage Snapshot, and a stowage Snapshot written in PyTorch's
// form for pytorch.org/memory_viz, with stowage's tags as the blocks' categories.
#include <nlohmann/json.hpp>

#include <string>

#include "stowage/snapshot.hpp"

namespace stowage::inspect {

// The frame that carries a stowage tag in PyTorch's form ("frames": [{"filename": this, ...}]).
inline constexpr const char* kTagFrameFile = "stowage tag";

// True for PyTorch's top-level dict ("segments" and "device_traces", no stowage "version").
bool is_pytorch_snapshot(const nlohmann::json& j);

// One device's memory (the lowest that has segments or trace entries). Statistics are what the
// segments say now; peaks come from replaying the trace, shifted to end at now (PyTorch's
// snapshot keeps no counters). A block's tag is its stowage tag frame when it has one, else its
// innermost frame ("name (file:line)"), else empty. ParseError naming the field otherwise.
Snapshot snapshot_from_pytorch(const nlohmann::json& j, const std::string& what);

// PyTorch's form of `snapshot`: segments with blocks, and the trace as device_traces[device]
// (times in microseconds); every block and trace entry carries its tag as a frame and as
// "category".
nlohmann::json to_pytorch(const Snapshot& snapshot);

}  // namespace stowage::inspect
