// Allocation pairs through PyTorch's C++ API from several threads at once (torch.empty and its
// free, as a framework's autograd, communication and data threads make them): whatever allocator
// PyTorch is using serves them. Loaded by bench/torch_allocator_bench.py with
// torch.utils.cpp_extension; Python threads could not do this (each pair holds the GIL).
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace {

// Pairs a second over all threads: `threads` threads each make `pairs` pairs of `size` bytes on
// `device`, all starting together; the time is the slowest thread's.
double pairs_per_second(std::int64_t size, std::int64_t threads, std::int64_t pairs, const std::string& device) {
  TORCH_CHECK(size > 0 && threads > 0 && pairs > 0, "size, threads and pairs must be positive");
  const auto options = torch::TensorOptions().dtype(torch::kUInt8).device(device);
  std::atomic<std::int64_t> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> seconds(static_cast<std::size_t>(threads));
  std::vector<std::thread> workers;
  {
    pybind11::gil_scoped_release no_gil;
    for (std::int64_t t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        { auto warm = torch::empty({size}, options); }  // this thread's first pair: caches filled
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        const auto start = std::chrono::steady_clock::now();
        for (std::int64_t i = 0; i < pairs; ++i) {
          auto x = torch::empty({size}, options);
        }
        seconds[static_cast<std::size_t>(t)] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      });
    }
    while (ready.load() < threads) std::this_thread::yield();
    go.store(true, std::memory_order_release);
    for (std::thread& w : workers) w.join();
  }
  double slowest = 0;
  for (double s : seconds) slowest = std::max(slowest, s);
  return static_cast<double>(threads * pairs) / slowest;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pairs_per_second", &pairs_per_second, "pairs a second over all threads", pybind11::arg("size"),
        pybind11::arg("threads"), pybind11::arg("pairs"), pybind11::arg("device"));
}
