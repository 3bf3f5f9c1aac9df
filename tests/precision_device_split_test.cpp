// Split and merge queued on a device (the backend's kernel table) against the host kernels, byte
// for byte: random bit patterns with ties, NaN and Inf; sizes that end inside a tie byte; ranges
// that start inside the array; planes and sources 16-byte aligned (CUDA's wide kernels) and not
// (the narrow ones). Bytes outside the range must stay as they were. Emulated device, and CUDA
// when a GPU is lent.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend_test_util.hpp"
#include "precision/device_kernels.hpp"
#include "stowage/allocator.hpp"
#include "stowage/cuda_device.hpp"
#include "stowage/device.hpp"
#include "stowage/precision.hpp"
#include "stowage/tensor.hpp"

namespace stowage {
namespace {

// The host arrays of one case: the fp32 values, both 16-bit planes and the tie bitmap.
struct Arrays {
  std::vector<float> fp32;
  std::vector<std::uint16_t> hi, lo;
  std::vector<std::uint8_t> ties;
};

class DeviceSplit : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const bool cuda = GetParam() == "cuda";
    if (cuda && cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
    device_ =
        testing::make_test_device(cuda ? DeviceKind::cuda : DeviceKind::emulated, {.capacity = std::size_t{1} << 30});
    alloc_ = std::make_unique<CachingAllocator>(*device_);
  }
  void TearDown() override {
    alloc_.reset();
    device_.reset();
  }

  // A device copy of `host` starting `offset` bytes into a fresh allocation.
  template <class T>
  void* upload(const std::vector<T>& host, std::size_t offset) {
    views_.push_back(TensorView::empty(*alloc_, DType::u8, {static_cast<std::int64_t>(host.size() * sizeof(T) + 64)}));
    auto* p = static_cast<std::uint8_t*>(views_.back().data()) + offset;
    device_->copy_async(p, host.data(), host.size() * sizeof(T), CopyKind::host_to_device, kDefaultStream);
    device_->synchronize(kDefaultStream);
    return p;
  }
  template <class T>
  std::vector<T> download(const void* p, std::size_t n) {
    std::vector<T> out(n);
    device_->synchronize(kDefaultStream);
    device_->copy_async(out.data(), p, n * sizeof(T), CopyKind::device_to_host, kDefaultStream);
    device_->synchronize(kDefaultStream);
    return out;
  }

  // Runs split (or merge) on [begin, end) on the host and on the device from the same starting
  // bytes; expects every array identical afterwards.
  void check(const Arrays& start, Rounding r, std::size_t begin, std::size_t end, std::size_t src_offset,
             std::size_t plane_offset, bool do_merge) {
    const std::size_t n = start.fp32.size();
    Arrays host = start;
    const SplitPlanes hp{host.hi.data(), host.lo.data(), r == Rounding::nearest_even ? host.ties.data() : nullptr, n,
                         r};
    auto* f = static_cast<float*>(upload(start.fp32, src_offset * sizeof(float)));
    auto* hi = static_cast<std::uint16_t*>(upload(start.hi, plane_offset * 2));
    auto* lo = static_cast<std::uint16_t*>(upload(start.lo, plane_offset * 2));
    auto* ties = static_cast<std::uint8_t*>(upload(start.ties, 0));
    const SplitPlanes dp{hi, lo, r == Rounding::nearest_even ? ties : nullptr, n, r};
    const auto& kernels = detail::device_kernels(*device_);
    if (do_merge) {
      merge(hp, host.fp32.data(), begin, end);
      kernels.merge(*device_, kDefaultStream, dp, f, begin, end);
    } else {
      split(host.fp32.data(), hp, begin, end);
      kernels.split(*device_, kDefaultStream, f, dp, begin, end);
    }
    EXPECT_EQ(std::memcmp(download<float>(f, n).data(), host.fp32.data(), n * 4), 0) << "fp32";
    EXPECT_EQ(download<std::uint16_t>(hi, n), host.hi) << "bf16 plane";
    EXPECT_EQ(download<std::uint16_t>(lo, n), host.lo) << "residual plane";
    EXPECT_EQ(download<std::uint8_t>(ties, host.ties.size()), host.ties) << "tie bits";
    views_.clear();
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<CachingAllocator> alloc_;
  std::vector<TensorView> views_;
};

// Random bits, a quarter of them exact ties (low half 0x8000), some NaN and Inf; planes and tie
// bytes start as noise so an unwritten or overwritten byte shows.
Arrays random_arrays(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Arrays a{std::vector<float>(n), std::vector<std::uint16_t>(n), std::vector<std::uint16_t>(n),
           std::vector<std::uint8_t>(n / 8 + 1)};
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t u = rng();
    const std::uint32_t kind = rng() % 16;
    if (kind < 4) u = (u & 0xFFFF0000u) | 0x8000u;                                                 // a tie
    if (kind == 4) u = 0x7F800000u | (u & 0x80000000u) | (rng() % 2 ? (u & 0x7FFFFFu) | 1u : 0u);  // NaN or Inf
    std::memcpy(&a.fp32[i], &u, 4);
    a.hi[i] = static_cast<std::uint16_t>(rng());
    a.lo[i] = static_cast<std::uint16_t>(rng());
  }
  for (auto& b : a.ties) b = static_cast<std::uint8_t>(rng());
  return a;
}

TEST_P(DeviceSplit, SplitAndMergeMatchTheHostByteForByte) {
  const std::vector<std::size_t> sizes = {1, 7, 8, 9, 63, 64, 65, 1000, 4099, (std::size_t{1} << 20) + 5};
  std::uint32_t seed = 1;
  for (std::size_t n : sizes) {
    for (Rounding r : {Rounding::half_up, Rounding::nearest_even}) {
      const Arrays start = random_arrays(n, seed++);
      // Whole array; a range from the first multiple of 8 past 0 to 3 short of the end.
      std::vector<std::pair<std::size_t, std::size_t>> ranges = {{0, n}};
      if (n > 11) ranges.emplace_back(8, n - 3);
      for (auto [begin, end] : ranges) {
        for (auto [src_off, plane_off] : {std::pair<std::size_t, std::size_t>{0, 0}, {1, 0}, {0, 1}, {1, 1}}) {
          for (bool do_merge : {false, true}) {
            SCOPED_TRACE("n=" + std::to_string(n) + " " + to_string(r) + " [" + std::to_string(begin) + "," +
                         std::to_string(end) + ") offsets " + std::to_string(src_off) + "/" +
                         std::to_string(plane_off) + (do_merge ? " merge" : " split"));
            check(start, r, begin, end, src_off, plane_off, do_merge);
            if (HasFailure()) return;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceSplit, ::testing::Values("emulated", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace stowage
