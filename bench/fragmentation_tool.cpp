// Fragmentation on a transformer training step: a trace generated from a model shape (GPT-like,
// flash attention, bf16 activations) is replayed through the caching allocator with classic and
// with expandable segments; prints peak reserved / peak allocated for each. A second trace varies
// the sequence length from step to step (1536, 1792, 2048), as packed or bucketed data does.
//   fragmentation_tool [layers hidden seq micro_batch steps]   (default 24 2048 2048 4 3)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

struct Op {
  bool alloc;
  std::size_t id, bytes;
};

class Trace {
 public:
  std::size_t alloc(std::size_t bytes) {
    ops_.push_back({true, next_, bytes});
    return next_++;
  }
  void free(std::size_t id) { ops_.push_back({false, id, 0}); }
  std::size_t temp(std::size_t bytes) {  // allocated and freed around one kernel
    const std::size_t id = alloc(bytes);
    free(id);
    return id;
  }
  const std::vector<Op>& ops() const { return ops_; }
  std::size_t ids() const { return next_; }

 private:
  std::vector<Op> ops_;
  std::size_t next_ = 0;
};

struct Shape {
  std::size_t layers = 24, hidden = 2048, seq = 2048, batch = 4, heads = 16, vocab = 50304, steps = 3;
};

// seq_scale[i] (in eighths) scales the sequence length of step i (cycled).
Trace make_trace(const Shape& m, const std::vector<std::size_t>& seq_eighths) {
  Trace t;
  const std::size_t h = m.hidden;
  const std::size_t bf16 = 2, workspace = 8 * MiB, bucket = 40 * MiB;
  // Persistent bf16 weights: embedding, then per layer qkv, proj, fc1, fc2 and two norms.
  const std::vector<std::size_t> layer_weights{3 * h * h * bf16, h * h * bf16, 4 * h * h * bf16,
                                               4 * h * h * bf16, 2 * h * bf16, 2 * h * bf16};
  t.alloc(m.vocab * h * bf16);
  for (std::size_t l = 0; l < m.layers; ++l) {
    for (std::size_t w : layer_weights) t.alloc(w);
  }
  for (std::size_t step = 0; step < m.steps; ++step) {
    const std::size_t seq = m.seq * seq_eighths[step % seq_eighths.size()] / 8;
    const std::size_t sb = seq * m.batch, sbh = sb * h;
    // Forward: what each layer keeps for backward (in order), with temporaries in between.
    std::vector<std::vector<std::size_t>> saved(m.layers);
    const std::size_t input = t.alloc(sbh * bf16);
    for (std::size_t l = 0; l < m.layers; ++l) {
      auto& s = saved[l];
      s.push_back(t.alloc(sbh * bf16));  // ln1 out
      s.push_back(t.alloc(sb * 4 * 2));  // ln1 mean, rstd
      t.temp(workspace);
      s.push_back(t.alloc(3 * sbh * bf16));  // qkv
      t.temp(workspace);
      s.push_back(t.alloc(sbh * bf16));        // attention out
      s.push_back(t.alloc(m.heads * sb * 4));  // log-sum-exp
      const std::size_t proj = t.alloc(sbh * bf16);
      s.push_back(t.alloc(sbh));         // dropout mask
      s.push_back(t.alloc(sbh * bf16));  // residual
      t.free(proj);
      s.push_back(t.alloc(sbh * bf16));  // ln2 out
      s.push_back(t.alloc(sb * 4 * 2));
      t.temp(workspace);
      s.push_back(t.alloc(4 * sbh * bf16));  // fc1 out
      s.push_back(t.alloc(4 * sbh * bf16));  // gelu out
      t.temp(workspace);
      const std::size_t fc2 = t.alloc(sbh * bf16);
      s.push_back(t.alloc(sbh));         // dropout mask
      s.push_back(t.alloc(sbh * bf16));  // residual
      t.free(fc2);
    }
    const std::size_t logits = t.alloc(sb * m.vocab * bf16);
    const std::size_t loss_tmp = t.alloc(sb * m.vocab * 4);  // fp32 softmax
    t.free(loss_tmp);
    // Backward: a gradient per saved tensor, freed once the next one exists; weight gradients
    // fill 40 MiB communication buckets, each freed one layer after it was sent.
    std::size_t grad = t.alloc(sb * m.vocab * bf16);
    t.free(logits);
    std::size_t dx = t.alloc(sbh * bf16);
    t.free(grad);
    std::vector<std::size_t> weight_grads;
    std::size_t in_bucket = 0, open_bucket = t.alloc(bucket), sent_bucket = SIZE_MAX;
    for (std::size_t l = m.layers; l-- > 0;) {
      auto& s = saved[l];
      for (std::size_t k = s.size(); k-- > 0;) {
        const std::size_t g = t.alloc(k == 10 || k == 11 ? 4 * sbh * bf16 : sbh * bf16);
        if (k % 4 == 0) t.temp(workspace);
        t.free(s[k]);
        t.free(dx);
        dx = g;
      }
      for (std::size_t w : layer_weights) {
        weight_grads.push_back(t.alloc(w));
        in_bucket += w;
        if (in_bucket >= bucket) {  // send this bucket, free the one sent before
          if (sent_bucket != SIZE_MAX) t.free(sent_bucket);
          sent_bucket = open_bucket;
          open_bucket = t.alloc(bucket);
          in_bucket = 0;
        }
      }
    }
    t.free(dx);
    t.free(input);
    if (sent_bucket != SIZE_MAX) t.free(sent_bucket);
    t.free(open_bucket);
    // Optimizer step: fp32 temporaries per weight gradient, then the gradients go.
    for (std::size_t l = 0; l < m.layers; ++l) t.temp(2 * layer_weights[2] * 2);
    for (std::size_t id : weight_grads) t.free(id);
  }
  return t;
}

struct Result {
  std::int64_t peak_allocated = 0, peak_reserved = 0, device_allocs = 0;
  double ms = 0;
};

Result replay(const Trace& trace, stowage::SegmentMode mode) {
  stowage::EmulatedOptions eo;
  eo.capacity = std::size_t{80} << 30;  // an 80 GiB device; memory is never touched
  auto dev = stowage::make_emulated_device(0, eo);
  stowage::AllocatorOptions o;
  o.segments = mode;
  stowage::CachingAllocator a(*dev, o);
  std::vector<void*> ptr(trace.ids(), nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  for (const Op& op : trace.ops()) {
    if (op.alloc) {
      ptr[op.id] = a.allocate(op.bytes);
    } else {
      a.deallocate(ptr[op.id]);
      ptr[op.id] = nullptr;
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  stowage::AllocatorStats st = a.stats();
  for (void* p : ptr) {
    if (p) a.deallocate(p);
  }
  return {st.allocated_bytes.all.peak, st.reserved_bytes.all.peak, st.num_device_alloc,
          std::chrono::duration<double, std::milli>(t1 - t0).count()};
}

}  // namespace

int main(int argc, char** argv) {
  Shape m;
  if (argc == 6) {
    m.layers = std::strtoull(argv[1], nullptr, 10);
    m.hidden = std::strtoull(argv[2], nullptr, 10);
    m.seq = std::strtoull(argv[3], nullptr, 10);
    m.batch = std::strtoull(argv[4], nullptr, 10);
    m.steps = std::strtoull(argv[5], nullptr, 10);
  } else if (argc != 1) {
    std::fprintf(stderr, "usage: %s [layers hidden seq micro_batch steps]\n", argv[0]);
    return 2;
  }
  std::printf("model: %zu layers, hidden %zu, sequence %zu, micro-batch %zu, %zu steps\n\n", m.layers, m.hidden, m.seq,
              m.batch, m.steps);
  std::printf(
      "| trace | segments | peak allocated (MiB) | peak reserved (MiB) | reserved / allocated | device allocs or maps "
      "| replay ms |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|\n");
  const std::pair<const char*, std::vector<std::size_t>> traces[] = {{"fixed sequence", {8}},
                                                                     {"sequence 6/8, 7/8, 8/8 of it", {6, 7, 8}}};
  for (const auto& [name, eighths] : traces) {
    const Trace trace = make_trace(m, eighths);
    for (auto mode : {stowage::SegmentMode::classic, stowage::SegmentMode::expandable}) {
      const Result r = replay(trace, mode);
      std::printf("| %s (%zu calls) | %s | %.1f | %.1f | %.3f | %lld | %.1f |\n", name, trace.ops().size(),
                  mode == stowage::SegmentMode::classic ? "classic" : "expandable",
                  static_cast<double>(r.peak_allocated) / MiB, static_cast<double>(r.peak_reserved) / MiB,
                  static_cast<double>(r.peak_reserved) / static_cast<double>(r.peak_allocated),
                  static_cast<long long>(r.device_allocs), r.ms);
    }
  }
  return 0;
}
