// `stowage inspect`: where did my memory go? Reads allocator snapshots (stowage's JSON, PyTorch's
// pickle or JSON) and event logs (CSV); writes a snapshot in PyTorch's form for memory_viz.
#include <fmt/format.h>

#include <fstream>
#include <iostream>

#include "stowage/error.hpp"
#include "tools/command.hpp"
#include "tools/inspect/inspect_report.hpp"
#include "tools/inspect/pickle_reader.hpp"
#include "tools/inspect/pytorch_export.hpp"
#include "tools/inspect/pytorch_snapshot.hpp"

namespace stowage::inspect {
namespace {

struct Options {
  std::string file;
  std::vector<std::string> compare;
  bool json = false;
  std::string svg, memory_viz;
  std::size_t top = 10;
  int device = -1;  // -1: the lowest in the file
};

// The snapshot of the device asked for (else the lowest) among a file's, analysed, with the
// file's devices listed.
SnapshotAnalysis analyze_device(const std::vector<Snapshot>& snapshots, std::vector<int> skipped,
                                const std::string& path, const Options& o) {
  std::vector<int> devices;
  const Snapshot* chosen = o.device < 0 ? &snapshots.front() : nullptr;
  for (const Snapshot& s : snapshots) {
    devices.push_back(s.device);
    if (s.device == o.device) chosen = &s;
  }
  if (!chosen)
    throw InvalidArgument(fmt::format("inspect --device {}: {} holds {}{}", o.device, path, device_list(devices),
                                      skipped.empty() ? "" : "; " + skipped_note(skipped)));
  SnapshotAnalysis a = analyze(*chosen, o.top);
  a.devices = std::move(devices);
  a.skipped_devices = std::move(skipped);
  return a;
}
SnapshotAnalysis analyze_device(const std::string& path, const Options& o) {
  std::vector<int> skipped;
  const std::vector<Snapshot> snapshots = load_snapshots(path, &skipped);
  return analyze_device(snapshots, std::move(skipped), path, o);
}

void write_file(const std::string& path, const std::string& text, const char* option = "--svg") {
  std::ofstream out(path, std::ios::binary);
  if (!out || !(out << text)) throw InvalidArgument(fmt::format("{}: cannot write '{}'", option, path));
}

int run(const Options& o) {
  if (!o.compare.empty()) {
    const SnapshotAnalysis a = analyze_device(o.compare[0], o);
    const SnapshotAnalysis b = analyze_device(o.compare[1], o);
    if (o.json) std::cout << compare_json(a, b).dump(2) << "\n";
    else std::cout << fmt::format("A = {}\nB = {}\n", o.compare[0], o.compare[1]) << compare_table(a, b);
    return 0;
  }
  if (o.file.empty()) throw InvalidArgument("inspect: give a snapshot (.json) or event log (.csv), or --compare A B");
  if (looks_like_event_log(o.file)) {
    const EventLogAnalysis a = analyze(load_event_log(o.file), o.top);
    if (!o.svg.empty()) write_file(o.svg, timeline_svg(a, o.file));
    if (o.json) std::cout << to_json(a).dump(2) << "\n";
    else std::cout << to_table(a);
    return 0;
  }
  std::vector<int> skipped;
  const std::vector<Snapshot> snapshots = load_snapshots(o.file, &skipped);
  const SnapshotAnalysis a = analyze_device(snapshots, std::move(skipped), o.file, o);
  if (!o.memory_viz.empty()) write_file(o.memory_viz, write_pickle(to_pytorch(snapshots)), "--to-memory-viz");
  if (!o.svg.empty()) write_file(o.svg, timeline_svg(a, o.file));
  if (o.json) std::cout << to_json(a).dump(2) << "\n";
  else std::cout << to_table(a);
  return 0;
}

void setup(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "inspect", "Read an allocator snapshot or event log: peaks, fragmentation, largest blocks, owning tags");
  cmd->add_option("file", o->file,
                  "snapshot: stowage's JSON (docs/snapshot.md) or PyTorch's (pickle from _dump_snapshot, or its "
                  "JSON); or an event-log CSV (docs/event_log.md)");
  cmd->add_option("--compare", o->compare, "two snapshots: what changed from A to B")->expected(2);
  cmd->add_flag("--json", o->json, "JSON output (schema stowage.inspect/1, docs/estimate.md)");
  cmd->add_option("--svg", o->svg, "write a timeline of allocated and reserved bytes");
  cmd->add_option("--to-memory-viz", o->memory_viz,
                  "write the snapshot (every device's) as a PyTorch snapshot pickle for pytorch.org/memory_viz "
                  "(tags as frames and categories)");
  cmd->add_option("--device", o->device,
                  "the device to analyse in a snapshot of several (PyTorch's); default: the lowest that has "
                  "segments or trace entries that change memory")
      ->check(CLI::Range(0, kMaxDevice));
  cmd->add_option("--top", o->top, "how many blocks and tags to list")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->callback([o, &exit_code] { exit_code = run(*o); });
}

STOWAGE_COMMAND(30, setup);

}  // namespace
}  // namespace stowage::inspect
