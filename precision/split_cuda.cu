// CUDA split / merge kernels. The wide form gives each thread a group of eight elements: two
// 16-byte fp32 accesses, one 16-byte access per 16-bit plane and the group's own tie byte (no
// ballot), which moves bytes near a device-to-device copy's rate. The narrow form (one element per
// thread, split_math_cuda.cuh) serves planes or sources that are not 16-byte aligned.
#include "precision/cuda_kernels.hpp"
#include "precision/split_math_cuda.cuh"

namespace stowage::cuda_precision {
namespace {

__global__ void fill_u16_kernel(std::uint16_t* dst, std::uint16_t value, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_step()) dst[i] = value;
}

// The loop runs while the warp's first element is in range, so all lanes reach the ballot.
__global__ void split_kernel(const float* src, SplitPlanes w, std::size_t begin, std::size_t end) {
  const bool rne = w.rounding == Rounding::nearest_even;
  for (std::size_t i = begin + first_index(); i - lane_index() < end; i += grid_step()) {
    const bool active = i < end;
    const std::uint32_t tie = active ? split_one(w, i, src[i], rne) : 0u;
    store_ties_warp(w, i, end, active, tie);
  }
}

__global__ void merge_kernel(SplitPlanes w, float* dst, std::size_t begin, std::size_t end) {
  for (std::size_t i = begin + first_index(); i < end; i += grid_step()) dst[i] = merge_one(w, i, tie_in(w, i));
}

// Group g holds elements [8g, 8g + 8). Full groups take the 16-byte path; the one group that the
// range's end cuts (if any) is written element by element, keeping the tie bits past the end.
__global__ void split_wide_kernel(const float* src, SplitPlanes w, std::size_t first_group, std::size_t end) {
  const bool rne = w.rounding == Rounding::nearest_even;
  const std::size_t groups = (end + 7) / 8;
  for (std::size_t g = first_group + first_index(); g < groups; g += grid_step()) {
    const std::size_t i = g * 8;
    std::uint32_t tie_byte = 0;
    if (i + 8 <= end) {
      const float4 a = reinterpret_cast<const float4*>(src + i)[0];
      const float4 b = reinterpret_cast<const float4*>(src + i)[1];
      const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      std::uint32_t hi_words[4] = {0, 0, 0, 0}, lo_words[4] = {0, 0, 0, 0};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const std::uint32_t t = __float_as_uint(x[k]) + 0x8000u;
        const std::uint32_t lo = t & 0xFFFFu;
        const std::uint32_t tie = (rne && lo == 0u) ? ((t >> 16) & 1u) : 0u;
        const std::uint32_t hi = (t >> 16) - tie;
        hi_words[k / 2] |= hi << (16 * (k % 2));  // little endian: element 2j is the low half
        lo_words[k / 2] |= lo << (16 * (k % 2));
        tie_byte |= tie << k;
      }
      *reinterpret_cast<uint4*>(w.bf16 + i) = make_uint4(hi_words[0], hi_words[1], hi_words[2], hi_words[3]);
      *reinterpret_cast<uint4*>(w.residual + i) = make_uint4(lo_words[0], lo_words[1], lo_words[2], lo_words[3]);
      if (rne) w.ties[g] = static_cast<std::uint8_t>(tie_byte);
    } else {
      for (std::size_t k = 0; i + k < end; ++k) tie_byte |= split_one(w, i + k, src[i + k], rne) << k;
      if (rne) {
        const std::uint32_t mask = (1u << (end - i)) - 1u;
        w.ties[g] = static_cast<std::uint8_t>((w.ties[g] & ~mask) | tie_byte);
      }
    }
  }
}

__global__ void merge_wide_kernel(SplitPlanes w, float* dst, std::size_t first_group, std::size_t end) {
  const bool rne = w.rounding == Rounding::nearest_even;
  const std::size_t groups = (end + 7) / 8;
  for (std::size_t g = first_group + first_index(); g < groups; g += grid_step()) {
    const std::size_t i = g * 8;
    const std::uint32_t tie_byte = rne ? w.ties[g] : 0u;
    if (i + 8 <= end) {
      const uint4 h = *reinterpret_cast<const uint4*>(w.bf16 + i);
      const uint4 l = *reinterpret_cast<const uint4*>(w.residual + i);
      const std::uint32_t hw[4] = {h.x, h.y, h.z, h.w}, lw[4] = {l.x, l.y, l.z, l.w};
      float out[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const std::uint32_t hi = ((hw[k / 2] >> (16 * (k % 2))) & 0xFFFFu) + ((tie_byte >> k) & 1u);
        const std::uint32_t lo = (lw[k / 2] >> (16 * (k % 2))) & 0xFFFFu;
        out[k] = __uint_as_float(((hi << 16) | lo) - 0x8000u);
      }
      reinterpret_cast<float4*>(dst + i)[0] = make_float4(out[0], out[1], out[2], out[3]);
      reinterpret_cast<float4*>(dst + i)[1] = make_float4(out[4], out[5], out[6], out[7]);
    } else {
      for (std::size_t k = 0; i + k < end; ++k) dst[i + k] = merge_one(w, i + k, (tie_byte >> k) & 1u);
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// begin is a multiple of 8, so element begin of each array is 16-byte aligned iff its base is.
bool wide_ok(const float* fp32, const SplitPlanes& w) {
  return aligned16(fp32) && aligned16(w.bf16) && aligned16(w.residual);
}

unsigned wide_blocks(std::size_t begin, std::size_t end) { return blocks_for(begin / 8, (end + 7) / 8); }

}  // namespace

CurrentDevice::CurrentDevice(int ordinal) {
  if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  if (previous_ != ordinal) detail::check_cuda(cudaSetDevice(ordinal), "cudaSetDevice (the precision kernels)");
}

CurrentDevice::~CurrentDevice() {
  int now = -1;
  if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
}

void fill_u16(std::uint16_t* dst, std::uint16_t value, std::size_t n, void* stream) {
  if (n == 0) return;
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  fill_u16_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads, 0,
                    static_cast<cudaStream_t>(stream)>>>(dst, value, n);
  detail::check_cuda(cudaGetLastError(), "fill_u16 launch");
}

void split(const float* src, const SplitPlanes& dst, std::size_t begin, std::size_t end, void* stream) {
  check_begin(begin, "cuda split");
  if (end <= begin) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (wide_ok(src, dst)) {
    split_wide_kernel<<<wide_blocks(begin, end), kThreads, 0, s>>>(src, dst, begin / 8, end);
  } else {
    split_kernel<<<blocks_for(begin, end), kThreads, 0, s>>>(src, dst, begin, end);
  }
  detail::check_cuda(cudaGetLastError(), "split launch");
}

void merge(const SplitPlanes& src, float* dst, std::size_t begin, std::size_t end, void* stream) {
  check_begin(begin, "cuda merge");
  if (end <= begin) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (wide_ok(dst, src)) {
    merge_wide_kernel<<<wide_blocks(begin, end), kThreads, 0, s>>>(src, dst, begin / 8, end);
  } else {
    merge_kernel<<<blocks_for(begin, end), kThreads, 0, s>>>(src, dst, begin, end);
  }
  detail::check_cuda(cudaGetLastError(), "merge launch");
}

}  // namespace stowage::cuda_precision
