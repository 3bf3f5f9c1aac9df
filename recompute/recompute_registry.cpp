// The recompute registry: which outputs each layer can release, the checks that make a release
// safe, and stream-ordered rematerialisation.
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "stowage/error.hpp"
#include "stowage/memory_resource.hpp"
#include "stowage/recompute.hpp"
#include "stowage/scoped_tag.hpp"

namespace stowage {

namespace {

struct Record {
  int layer = 0;
  std::string tag;
  std::vector<TensorView> inputs, outputs;
  RecomputeFn fn;
  RngState rng;
};

// The registries whose function runs on this thread now, innermost first: a function calling
// back into its own registry would deadlock on the registry's lock (or, from forward(), change
// what is registered under a function being registered), so each entry point refuses it.
struct RunningFn {
  const void* registry;
  const RunningFn* outer;
};
thread_local const RunningFn* running = nullptr;

class InFunction {
 public:
  explicit InFunction(const void* registry) : self_{registry, running} { running = &self_; }
  ~InFunction() { running = self_.outer; }
  InFunction(const InFunction&) = delete;
  InFunction& operator=(const InFunction&) = delete;

 private:
  RunningFn self_;
};

void refuse_reentry(const void* registry, const char* fn) {
  for (const RunningFn* r = running; r != nullptr; r = r->outer)
    if (r->registry == registry)
      throw InvalidArgument(
          fmt::format("Recompute::{}: called from inside a function this registry is running (forward or recompute); a "
                      "registered function must not call back into its registry",
                      fn));
}

// The distinct storages behind some views (pointers into the views: copying a Storage would
// add a handle and disturb the use counts the release check reads).
std::vector<Storage*> distinct_storages(std::vector<TensorView>& views) {
  std::vector<Storage*> out;
  for (auto& v : views) {
    bool seen = false;
    for (Storage* s : out) seen = seen || s->same_as(v.storage());
    if (!seen) out.push_back(&v.storage());
  }
  return out;
}

}  // namespace

struct Recompute::Impl {
  ResourceHandle resource;
  RecomputeOptions options;
  mutable std::mutex mutex;
  std::map<int, std::vector<std::unique_ptr<Record>>> layers;
  std::uint64_t next_stream = 0;
  RecomputeStats stats;

  Impl(ResourceHandle r, RecomputeOptions o) : resource(std::move(r)), options(o) {}

  template <class Fn>
  void for_each_record(Fn&& fn) {
    for (auto& [layer, records] : layers)
      for (auto& r : records) fn(*r);
  }

  // Output views of live registrations on storage s: each accounts for two handles (the
  // record's view and the one the caller was given).
  long known_handles(const Storage& s) {
    long n = 0;
    for_each_record([&](Record& r) {
      for (auto& v : r.outputs) n += v.storage().same_as(s) ? 2 : 0;
    });
    return n;
  }

  void check_releasable(const Record& rec, std::size_t index, Storage& s) {
    const auto where = [&] { return fmt::format("Recompute::release: {} output {}", rec.tag, index); };
    if (s.state() == StorageState::swapped_out)
      throw InvalidArgument(where() + ": is swapped out; a tensor is either swapped or released, not both");
    if (s.resource() != resource.raw())
      throw InvalidArgument(where() + ": its storage is wrapped or from another memory resource");
    for_each_record([&](Record& other) {
      for (auto& in : other.inputs)
        if (in.storage().same_as(s))
          throw InvalidArgument(
              fmt::format("{}: shares its storage with an input of {}; releasing it would "
                          "destroy that input",
                          where(), other.tag));
    });
    const long known = known_handles(s);
    if (s.use_count() > known)
      throw InvalidArgument(fmt::format(
          "{}: its storage has {} handles but the registry accounts for {} (its record and the view "
          "forward returned); another live view aliases it (a slice, a reshape or a kept copy): drop it first",
          where(), s.use_count(), known));
  }

  // Brings back and recomputes a layer's released outputs. All checks and allocations happen
  // before any function runs; on failure every storage materialised here is released again.
  void rematerialize(int layer) {
    auto it = layers.find(layer);
    if (it == layers.end()) return;
    struct Plan {
      Record* rec;
      std::vector<Storage*> storages;
    };
    std::vector<Plan> plan;
    for (auto& r : it->second) {
      Plan p{r.get(), {}};
      for (Storage* s : distinct_storages(r->outputs))
        if (s->state() == StorageState::released) p.storages.push_back(s);
      if (p.storages.empty()) continue;
      for (std::size_t i = 0; i < r->inputs.size(); ++i)
        if (!r->inputs[i].storage().resident())
          throw InvalidArgument(fmt::format("Recompute::before_backward: input {} of {} is {}; bring it back first", i,
                                            r->tag, to_string(r->inputs[i].storage().state())));
      plan.push_back(std::move(p));
    }
    const Stream stream = options.compute_stream;
    std::vector<Storage*> done;
    try {
      for (auto& p : plan) {
        ScopedTag tag(p.rec->tag);
        for (Storage* s : p.storages) {
          s->materialize(stream);
          done.push_back(s);
        }
      }
    } catch (...) {
      for (Storage* s : done) s->release(StorageState::released);
      throw;
    }
    std::size_t ran = 0;
    try {
      for (; ran < plan.size(); ++ran) {
        auto& p = plan[ran];
        ScopedTag tag(p.rec->tag);  // allocations f makes for scratch show under the layer too
        InFunction in(this);
        p.rec->fn(RecomputeContext{p.rec->inputs, p.rec->outputs, resource->device(), stream, p.rec->rng, true});
        for (Storage* s : p.storages) {
          ++stats.rematerializations;
          stats.bytes_recomputed += s->nbytes();
        }
      }
    } catch (...) {
      // Outputs whose function did not finish hold no valid bytes: released again (stream-ordered
      // after whatever f queued), so the next before_backward recomputes them.
      for (std::size_t i = ran; i < plan.size(); ++i)
        for (Storage* s : plan[i].storages) s->release(StorageState::released);
      throw;
    }
  }

  std::unique_ptr<Record> new_record(int layer, const std::string& name, std::vector<TensorView> inputs,
                                     RecomputeFn fn) {
    if (!fn) throw InvalidArgument("Recompute::forward: empty function");
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (!inputs[i].defined()) throw InvalidArgument(fmt::format("Recompute::forward: input {} is undefined", i));
    auto rec = std::make_unique<Record>();
    rec->layer = layer;
    rec->tag = fmt::format("layer{}.{}", layer, name);
    rec->inputs = std::move(inputs);
    rec->fn = std::move(fn);
    std::lock_guard lock(mutex);
    rec->rng = RngState{options.seed, next_stream++};
    return rec;
  }

  void add(std::unique_ptr<Record> rec) {
    std::lock_guard lock(mutex);
    layers[rec->layer].push_back(std::move(rec));
  }
};

Recompute::Recompute(ResourceHandle resource, RecomputeOptions options) {
  if (options.prefetch_distance < 0)
    throw InvalidArgument(fmt::format("Recompute: prefetch distance {} is negative", options.prefetch_distance));
  impl_ = std::make_unique<Impl>(std::move(resource), options);
}

Recompute::~Recompute() = default;

std::vector<TensorView> Recompute::forward(int layer, const std::string& name, std::vector<TensorView> inputs,
                                           const std::vector<OutputSpec>& outputs, RecomputeFn fn) {
  refuse_reentry(impl_.get(), "forward");
  auto rec = impl_->new_record(layer, name, std::move(inputs), std::move(fn));
  const Stream stream = impl_->options.compute_stream;
  ScopedTag tag(rec->tag);
  for (const auto& spec : outputs)
    rec->outputs.push_back(TensorView::empty(impl_->resource, spec.dtype, spec.shape, stream));
  {
    InFunction in(impl_.get());
    rec->fn(RecomputeContext{rec->inputs, rec->outputs, impl_->resource->device(), stream, rec->rng, false});
  }
  std::vector<TensorView> result = rec->outputs;
  impl_->add(std::move(rec));
  return result;
}

void Recompute::forward_into(int layer, const std::string& name, std::vector<TensorView> inputs,
                             std::vector<TensorView> outputs, RecomputeFn fn) {
  refuse_reentry(impl_.get(), "forward_into");
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& o = outputs[i];
    if (!o.defined() || !o.storage().resident())
      throw InvalidArgument(fmt::format("Recompute::forward_into: output {} is undefined or not resident", i));
    if (o.storage().resource() != impl_->resource.raw())
      throw InvalidArgument(
          fmt::format("Recompute::forward_into: output {} is not from this registry's memory resource", i));
    std::lock_guard lock(impl_->mutex);
    if (impl_->known_handles(o.storage()) > 0)
      throw InvalidArgument(fmt::format("Recompute::forward_into: output {}'s storage is already registered", i));
  }
  auto rec = impl_->new_record(layer, name, std::move(inputs), std::move(fn));
  rec->outputs = std::move(outputs);
  const Stream stream = impl_->options.compute_stream;
  ScopedTag tag(rec->tag);
  {
    InFunction in(impl_.get());
    rec->fn(RecomputeContext{rec->inputs, rec->outputs, impl_->resource->device(), stream, rec->rng, false});
  }
  impl_->add(std::move(rec));
}

std::size_t Recompute::release(int layer) {
  refuse_reentry(impl_.get(), "release");
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->layers.find(layer);
  if (it == impl_->layers.end()) return 0;
  std::vector<Storage*> todo;
  for (auto& r : it->second) {
    std::size_t index = 0;
    for (Storage* s : distinct_storages(r->outputs)) {
      if (s->state() != StorageState::released) {
        impl_->check_releasable(*r, index, *s);
        bool seen = false;
        for (Storage* t : todo) seen = seen || t->same_as(*s);
        if (!seen) todo.push_back(s);
      }
      ++index;
    }
  }
  std::size_t bytes = 0;
  for (Storage* s : todo) {
    s->release(StorageState::released);
    bytes += s->nbytes();
    ++impl_->stats.releases;
  }
  impl_->stats.bytes_released += bytes;
  return bytes;
}

void Recompute::before_backward(int layer) {
  refuse_reentry(impl_.get(), "before_backward");
  std::lock_guard lock(impl_->mutex);
  impl_->rematerialize(layer);
  for (int d = 1; d <= impl_->options.prefetch_distance; ++d) {
    try {
      impl_->rematerialize(layer - d);
    } catch (const InvalidArgument&) {
      ++impl_->stats.prefetches_deferred;
    } catch (const OutOfMemory&) {
      ++impl_->stats.prefetches_deferred;
    }
  }
}

void Recompute::after_backward(int layer) {
  refuse_reentry(impl_.get(), "after_backward");
  std::lock_guard lock(impl_->mutex);
  impl_->layers.erase(layer);
}

bool Recompute::released(int layer) const {
  refuse_reentry(impl_.get(), "released");
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->layers.find(layer);
  if (it == impl_->layers.end()) return false;
  for (auto& r : it->second)
    for (auto& v : r->outputs)
      if (v.storage().state() == StorageState::released) return true;
  return false;
}

std::vector<RecomputeEntry> Recompute::entries() const {
  refuse_reentry(impl_.get(), "entries");
  std::lock_guard lock(impl_->mutex);
  std::vector<RecomputeEntry> out;
  for (auto& [layer, records] : impl_->layers)
    for (auto& r : records)
      for (Storage* s : distinct_storages(r->outputs)) out.push_back({layer, r->tag, s->nbytes(), s->state()});
  return out;
}

RecomputeStats Recompute::stats() const {
  refuse_reentry(impl_.get(), "stats");
  std::lock_guard lock(impl_->mutex);
  RecomputeStats st = impl_->stats;
  st.released_bytes_now = 0;
  for (auto& [layer, records] : impl_->layers)
    for (auto& r : records)
      for (Storage* s : distinct_storages(r->outputs))
        if (s->state() == StorageState::released) st.released_bytes_now += s->nbytes();
  return st;
}

const RecomputeOptions& Recompute::options() const { return impl_->options; }

}  // namespace stowage
