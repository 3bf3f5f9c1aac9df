// stowage in one page: a caching allocator on a device, tensors on it, BF16/FP32 shared-storage
// weights with a fused AdamW step, an activation released after forward and recomputed before
// backward, and the allocator's statistics. Runs on the first CUDA GPU, or on an emulated device
// without one. Each step checks its result; the program exits non-zero on a mismatch.
#include <stowage/activations.hpp>
#include <stowage/bucket_optimizers.hpp>
#include <stowage/caching_allocator.hpp>
#include <stowage/parameter_bucket.hpp>
#include <stowage/recompute.hpp>
#include <stowage/runtime.hpp>
#include <stowage/statistics_resource.hpp>
#include <stowage/tensor.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

namespace {

int failures = 0;
void check(bool ok, const char* what) {
  std::printf("  %-58s %s\n", what, ok ? "ok" : "MISMATCH");
  failures += ok ? 0 : 1;
}

// Host values into a new device tensor, and back.
stowage::TensorView upload(stowage::MemoryResource& memory, const std::vector<float>& values) {
  auto t = stowage::TensorView::empty(memory, stowage::DType::f32, {static_cast<std::int64_t>(values.size())});
  memory.device().copy_async(t.data(), values.data(), t.nbytes(), stowage::CopyKind::host_to_device,
                             stowage::kDefaultStream);
  memory.device().synchronize(stowage::kDefaultStream);
  return t;
}
std::vector<float> download(const stowage::TensorView& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  t.storage().device().copy_async(out.data(), t.data(), t.nbytes(), stowage::CopyKind::device_to_host,
                                  stowage::kDefaultStream);
  t.storage().device().synchronize(stowage::kDefaultStream);
  return out;
}

}  // namespace

int main() {
  using namespace stowage;
  // 1. The allocator: one caching allocator per device, composed with a statistics adaptor.
  Device& dev = device(0);
  std::printf("device: %s\n", dev.name().c_str());
  auto caching = std::make_shared<CachingAllocator>(dev);
  auto memory = std::make_shared<StatisticsResource>(caching);

  // 2. Tensor views: a storage and views of it that stay valid when the bytes move.
  const std::size_t n = 4096;
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = std::sin(0.01f * static_cast<float>(i));
  TensorView x = upload(*memory, values);
  TensorView rows = x.reshape({64, 64}).slice(0, 8, 16);
  check(rows.numel() == 8 * 64 && rows.storage().same_as(x.storage()), "a slice is a view of the same storage");

  // 3. Shared-storage weights: the bf16 weights are the high halves of the fp32 master.
  ParameterBucket weights(memory, {{"w", {static_cast<std::int64_t>(n)}}}, BucketOptions{});
  weights.write_fp32(0, values.data(), n);
  std::vector<float> master(n);
  weights.read_fp32(0, master.data(), n);
  check(std::memcmp(master.data(), values.data(), n * 4) == 0, "the fp32 master round-trips exactly");
  check(weights.nbytes() < n * 6, "weights take under 6 bytes per parameter (4 + ties)");

  // A fused AdamW step on that storage, against the same update on a plain fp32 array.
  std::vector<float> grad(n);
  for (std::size_t i = 0; i < n; ++i) grad[i] = std::cos(0.003f * static_cast<float>(i));
  TensorView g = upload(*memory, grad);
  TensorView m = upload(*memory, std::vector<float>(n, 0.0f));
  TensorView v = upload(*memory, std::vector<float>(n, 0.0f));
  AdamOptions adam;
  adam.lr = 1e-2f;
  adam.weight_decay = 0.1f;
  OptimizerState state;
  const StepResult step = adam_step(weights, g, m, v, adam, GradScaling{}, state);
  dev.synchronize(weights.stream());
  std::vector<float> ref = values, ref_m(n, 0.0f), ref_v(n, 0.0f);
  adam_step_range_fp32(ref.data(), HostGrad{grad.data(), DType::f32}, ref_m.data(), ref_v.data(), 0, n,
                       adam_scalars(adam, 1));
  weights.read_fp32(0, master.data(), n);
  check(step.applied && std::memcmp(master.data(), ref.data(), n * 4) == 0,
        "fused AdamW on shared storage == fp32 AdamW, bit for bit");

  // 4. Recompute: the activation's output is released after forward and recomputed before
  // backward from a hook, bit for bit.
  Recompute recompute(memory);
  auto y =
      recompute.forward(0, "gelu", {x}, {{DType::f32, {static_cast<std::int64_t>(n)}}}, [](const RecomputeContext& c) {
        activation_forward(Activation::gelu_tanh, c.inputs[0], c.outputs[0], c.stream);
      });
  const std::vector<float> before = download(y[0]);
  const std::size_t released = recompute.release(0);
  check(released == n * 4 && !y[0].storage().resident(), "release gives the activation's bytes back");
  recompute.before_backward(0);
  check(download(y[0]) == before, "before_backward recomputes it bit for bit");
  recompute.after_backward(0);

  // 5. Statistics: the adaptor's view (bytes asked for) and the allocator's (PyTorch's names).
  const ResourceStatistics s = memory->statistics();
  const AllocatorStats a = caching->stats();
  std::printf("  live: %lld allocations, %lld bytes asked for (peak %lld)\n",
              static_cast<long long>(s.allocations.current), static_cast<long long>(s.bytes.current),
              static_cast<long long>(s.bytes.peak));
  std::printf("  allocator: allocated_bytes.all.peak %lld, reserved_bytes.all.peak %lld\n",
              static_cast<long long>(a.allocated_bytes.all.peak), static_cast<long long>(a.reserved_bytes.all.peak));
  check(a.requested_bytes.all.current == s.bytes.current, "both views agree on the bytes asked for");

  std::printf("%s\n", failures == 0 ? "quickstart: all checks passed" : "quickstart: FAILED");
  return failures == 0 ? 0 : 1;
}
