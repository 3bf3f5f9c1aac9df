// How fast `stowage plan` searches: candidate plans per second on the searches below, with two
// threads and one, against the peer of calling the memory estimator once per candidate on one
// thread (what a search without per-layer choices and without the time model would cost).
// Target (issue 23): 10^5 candidates in under 2 s on 2 cores. Prints markdown.
//
//   plan_tool [--quick]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tools/plan/search.hpp"

using namespace stowage;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Workload {
  const char* name;
  const char* model;
  std::int64_t gpus, global_batch, seq;
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int repeats = quick ? 1 : 5;
  const Workload workloads[] = {
      {"llama2-70b, 1024 GPUs, GBS 1024, seq 4096", "llama2-70b", 1024, 1024, 4096},
      {"llama3-70b, 512 GPUs, GBS 512, seq 8192", "llama3-70b", 512, 512, 8192},
      {"gpt3-175b, 2048 GPUs, GBS 1536, seq 2048", "gpt3-175b", 2048, 1536, 2048},
      {"mixtral-8x7b, 256 GPUs, GBS 512, seq 4096", "mixtral-8x7b", 256, 512, 4096},
  };
  std::printf("### `stowage plan` search speed\n\n");
  std::printf(
      "Median of %d runs each. Peer: the memory estimator called once per candidate on one thread "
      "(no per-layer choice, no time model). Target: 10^5 candidates in under 2 s on 2 cores.\n\n",
      repeats);
  std::printf(
      "| search | candidates | estimator calls | search, 2 threads (s) | search, 1 thread (s) | candidates/s (2 "
      "threads) "
      "| peer: estimator once per candidate (s) | search 2 threads / peer "
      "|\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Workload& w : workloads) {
    plan::PlanRequest r;
    r.base.model = estimate::preset(w.model);
    r.base.training.global_batch = w.global_batch;
    r.base.training.seq_length = w.seq;
    r.cluster.gpus = w.gpus;
    auto median = [&](auto&& fn) {
      std::vector<double> t;
      for (int i = 0; i < repeats; ++i) t.push_back(fn());
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    plan::SearchStats stats;
    r.threads = 2;
    const double two = median([&] {
      const auto t0 = std::chrono::steady_clock::now();
      stats = plan::search(r).stats;
      return seconds_since(t0);
    });
    r.threads = 1;
    const double one = median([&] {
      const auto t0 = std::chrono::steady_clock::now();
      (void)plan::search(r);
      return seconds_since(t0);
    });
    std::int64_t sink = 0;
    const double peer = median([&] {
      const auto t0 = std::chrono::steady_clock::now();
      plan::for_each_candidate(r, [&](const estimate::RunConfig& c) {
        try {
          sink += estimate::estimate_memory(c).peak_reserved;
        } catch (const std::exception&) {
        }
      });
      return seconds_since(t0);
    });
    std::printf("| %s | %lld | %lld | %.3f | %.3f | %.0f | %.3f | %.2f |\n", w.name, (long long)stats.candidates,
                (long long)stats.evaluations, two, one, double(stats.candidates) / two, peer, two / peer);
    if (sink == 42) std::printf(" ");
  }
  return 0;
}
