#pragma once
// `stowage inspect` output: tables, JSON (schema "stowage.inspect/1", docs/estimate.md §inspect)
// and the timeline SVG of allocated and reserved bytes.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tools/inspect/event_log_analysis.hpp"
#include "tools/inspect/snapshot_analysis.hpp"

namespace stowage::inspect {

// "cuda:0, cuda:2"; and why devices were skipped (pytorch_devices), for notes and errors.
std::string device_list(const std::vector<int>& devices);
std::string skipped_note(const std::vector<int>& skipped);

std::string to_table(const SnapshotAnalysis& a);
nlohmann::json to_json(const SnapshotAnalysis& a);
std::string to_table(const EventLogAnalysis& a);
nlohmann::json to_json(const EventLogAnalysis& a);

// What changed from snapshot A to B: statistics and bytes per tag (largest change first).
nlohmann::json compare_json(const SnapshotAnalysis& a, const SnapshotAnalysis& b);
std::string compare_table(const SnapshotAnalysis& a, const SnapshotAnalysis& b);

// Timeline charts; a snapshot without a trace gives a chart with its current values only.
std::string timeline_svg(const SnapshotAnalysis& a, const std::string& title);
std::string timeline_svg(const EventLogAnalysis& a, const std::string& title);

}  // namespace stowage::inspect
