#pragma once
// PyTorch's memory snapshot (torch.cuda.memory._snapshot(), pickled by _dump_snapshot, or the
// same dict as JSON) read as stowage Snapshots, one per device (pytorch_export.hpp writes them
// back in PyTorch's form).
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "stowage/snapshot.hpp"
#include "tools/inspect/pickle_reader.hpp"

namespace stowage::inspect {

// The frame that carries a stowage tag in PyTorch's form ("frames": [{"filename": this, ...}]).
inline constexpr const char* kTagFrameFile = "stowage tag";

// True for PyTorch's top-level dict ("segments" and "device_traces", no stowage "version").
bool is_pytorch_snapshot(const nlohmann::json& j);

// Keeps, of every "frames" list, only the frame that becomes the tag (see snapshot_from_pytorch):
// PyTorch shares one frames list per distinct stack, and with stacks="all" expanding each
// reference in full costs gigabytes.
const ListSelector& pytorch_frames_selector();
// read_pickle with that selector.
nlohmann::json read_pytorch_pickle(std::string_view data, const std::string& what);

// Devices beyond this one are refused as malformed.
inline constexpr int kMaxDevice = 1024;

// The devices that have segments or trace entries that change memory, lowest first (empty when
// none has). `skipped` gets those whose traces hold only other entries: PyTorch marks each
// snapshot() in every device's trace, used or not (a dump shows the earlier calls' marks).
// ParseError for a dict without "segments" and "device_traces" lists, or a device out of range.
std::vector<int> pytorch_devices(const nlohmann::json& j, const std::string& what, std::vector<int>* skipped = nullptr);

// One device's memory (`device`; -1: the lowest pytorch_devices gives, else the lowest it
// skipped, else 0); a bare list of segments (an older form) reads as segments without a trace.
// Statistics are what the segments say now; peaks come from replaying the trace, shifted to end
// at now (PyTorch's snapshot keeps no counters). Trace sizes become block sizes (PyTorch traces
// the requested size; pytorch_blocks.hpp). An OOM entry's address is the device_free PyTorch
// wrote there, its size the request, any up to 2^64 - 1 (other sizes above 256 TiB are refused).
// A block's frames and requested size are its own, else (PyTorch 2.0 and 1.13) those of
// history[0] (`real_size`); a free block's requested size is 0 (PyTorch's is left over from an
// earlier allocation). A block's tag is its stowage tag frame when it has one, else the first
// frame that memory_viz shows (its _frame_filter) from a .py file, else the first it shows, else
// the innermost ("name (file:line)"), else empty. ParseError naming the field and the entry
// otherwise, floats in integer fields included.
Snapshot snapshot_from_pytorch(const nlohmann::json& j, const std::string& what, int device = -1);

}  // namespace stowage::inspect
