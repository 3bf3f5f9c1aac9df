// `stowage demo`: trains a small transformer under each memory technique and shows, for each,
// the loss curve, the measured peak device memory, the step time, and whether every step's
// loss is bit-identical to the baseline.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <system_error>

#include <unistd.h>

#include "stowage/error.hpp"
#include "tools/command.hpp"
#include "tools/demo/report.hpp"
#include "tools/demo/run.hpp"

namespace stowage::demo {
namespace {

struct CliOptions {
  DemoOptions demo;
  std::string configs = "baseline,shared,recompute,swap,offload,all";
  std::string rounding = "nearest_even";
  std::string svg;
  bool json = false;
};

// One spelling across the tool: the library's (stowage::to_string(Rounding)), as `estimate` takes it.
Rounding parse_rounding(const std::string& s) {
  if (s == "nearest_even") return Rounding::nearest_even;
  if (s == "half_up") return Rounding::half_up;
  throw InvalidArgument(fmt::format("demo: --rounding must be nearest_even or half_up (got '{}')", s));
}

// Only configurations this build offers; those asked for but missing are named on stderr.
std::vector<Configuration> configs_in_build(const std::string& requested, bool explicit_request) {
  if (explicit_request) return select_configurations(requested);
  std::string available;
  for (const auto& c : all_configurations()) available += (available.empty() ? "" : ",") + c.name;
  return select_configurations(available);
}

// "ETA 1m05s": the time left at the average pace of the steps so far (configurations take
// similar times; the first steps include set-up, so the estimate settles as the run goes).
std::string eta_text(double elapsed_s, double done, double total) {
  if (done <= 0 || done >= total) return done >= total ? fmt::format("done in {:.1f}s  ", elapsed_s) : "";
  const long long left = std::llround(elapsed_s / done * (total - done));
  return left >= 60 ? fmt::format("ETA {}m{:02}s", left / 60, left % 60) : fmt::format("ETA {}s ", left);
}

// An output path that cannot be written is a bad flag, refused before any training: not found
// after every configuration has run. An existing file is left as it is until the chart replaces
// it; one made by the check is removed.
void check_writable(const std::string& path, const char* option) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);  // through a symbolic link: its target
  errno = 0;
  const bool ok = std::ofstream(path, std::ios::app).good();  // app: creates, never truncates
  const int err = errno;
  if (!ok)
    throw InvalidArgument(fmt::format("demo: {}: cannot write '{}'{}", option, path,
                                      err != 0 ? fmt::format(" ({})", std::strerror(err)) : ""));
  // The file the check made goes again (a dangling link's target, not the link).
  if (!existed) std::filesystem::remove(std::filesystem::weakly_canonical(path, ec), ec);
}

int run(CliOptions& o, bool configs_given) {
  if (!o.svg.empty()) check_writable(o.svg, "--svg");
  o.demo.rounding = parse_rounding(o.rounding);
  o.demo.configs = configs_in_build(o.configs, configs_given);
  std::string device_note;
  o.demo.device = &demo_device(&device_note);
  if (!o.json) {
    std::fprintf(stderr, "stowage demo: training on the %s\n", device_note.c_str());
    if (!configs_given)
      for (const auto& m : missing_techniques()) std::fprintf(stderr, "stowage demo: not in this run: %s\n", m.c_str());
  }
  // One line rewritten in place on a terminal; every tenth of the run otherwise (logs, CI).
  const bool tty = isatty(fileno(stderr)) != 0;
  const int every = std::max(1, o.demo.steps / 10);
  const auto started = std::chrono::steady_clock::now();
  const double total_steps = static_cast<double>(o.demo.configs.size()) * o.demo.steps;
  auto progress = [&](std::size_t config, int step, float loss, const ConfigResult&) {
    if (o.json) return;
    const bool end = step == o.demo.steps;
    if (!tty && !end && step % every != 0) return;
    const double done = static_cast<double>(config) * o.demo.steps + step;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::fprintf(stderr, "%s[%zu/%zu] %-10s step %4d/%d  loss %.4f  %s%s", tty ? "\r" : "", config + 1,
                 o.demo.configs.size(), o.demo.configs[config].name.c_str(), step, o.demo.steps,
                 static_cast<double>(loss), eta_text(elapsed, done, total_steps).c_str(), tty && !end ? "" : "\n");
    std::fflush(stderr);
  };
  const auto results = run_demo(o.demo, progress);
  DemoOptions shown = o.demo;
  if (!results.empty()) shown.shape.vocab = results.front().vocab;
  if (o.json) {
    std::printf("%s\n", to_json(results, shown).c_str());
  } else {
    std::printf("\n%s", format_table(results, shown).c_str());
  }
  if (!o.svg.empty()) {
    std::ofstream f(o.svg);
    f << to_svg(results, shown);
    if (!f) throw Error(fmt::format("demo: --svg: cannot write '{}'", o.svg));
    if (!o.json) std::printf("wrote %s\n", o.svg.c_str());
  }
  int mismatches = 0;
  for (const auto& r : results)
    if (r.compared && !r.bit_identical && r.must_match) ++mismatches;
  return mismatches == 0 ? 0 : 3;
}

void setup(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<CliOptions>();
  auto* cmd = app.add_subcommand("demo", "train a small transformer with every memory technique and compare");
  auto& s = o->demo.shape;
  cmd->add_option("--layers", s.layers, "transformer blocks")->capture_default_str();
  cmd->add_option("--hidden", s.hidden, "hidden size")->capture_default_str();
  cmd->add_option("--heads", s.heads, "attention heads")->capture_default_str();
  cmd->add_option("--seq", s.seq, "sequence length (characters)")->capture_default_str();
  cmd->add_option("--batch", s.batch, "sequences per step")->capture_default_str();
  cmd->add_option("--steps", o->demo.steps, "training steps per configuration")->capture_default_str();
  auto* configs = cmd->add_option("--configs", o->configs,
                                  "comma-separated: baseline,shared,recompute,swap,offload,all (default: every "
                                  "one this build has)");
  cmd->add_option("--rounding", o->rounding, "shared storage rounding: nearest_even (bit-identical) or half_up")
      ->capture_default_str();
  cmd->add_option("--svg", o->svg, "write an SVG bar chart of peak memory per configuration");
  cmd->add_flag("--json", o->json, "JSON output (losses with their bit patterns, peaks, step times)");
  cmd->callback([o, configs, &exit_code] { exit_code = run(*o, configs->count() > 0); });
}

STOWAGE_COMMAND(40, setup);

}  // namespace
}  // namespace stowage::demo
