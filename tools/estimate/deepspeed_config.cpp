#include "tools/estimate/deepspeed_config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string_view>
#include <utility>

#include "common/text.hpp"
#include "stowage/error.hpp"
#include "tools/common/json_input.hpp"

namespace stowage::estimate {

namespace {

using Names = std::span<const std::string_view>;

// DeepSpeedZeroConfig's fields and aliases (deepspeed/runtime/zero/config.py; populate_by_name:
// both spellings are accepted). Its base model forbids any other key (config_utils.py).
constexpr std::string_view kZeroKeys[] = {"stage",
                                          "contiguous_gradients",
                                          "reduce_scatter",
                                          "reduce_bucket_size",
                                          "use_multi_rank_bucket_allreduce",
                                          "allgather_partitions",
                                          "allgather_bucket_size",
                                          "overlap_comm",
                                          "load_from_fp32_weights",
                                          "elastic_checkpoint",
                                          "offload_param",
                                          "offload_optimizer",
                                          "zenflow",
                                          "sub_group_size",
                                          "cpu_offload_param",
                                          "cpu_offload_use_pin_memory",
                                          "cpu_offload",
                                          "prefetch_bucket_size",
                                          "stage3_prefetch_bucket_size",
                                          "param_persistence_threshold",
                                          "stage3_param_persistence_threshold",
                                          "model_persistence_threshold",
                                          "stage3_model_persistence_threshold",
                                          "max_live_parameters",
                                          "stage3_max_live_parameters",
                                          "max_reuse_distance",
                                          "stage3_max_reuse_distance",
                                          "gather_16bit_weights_on_model_save",
                                          "stage3_gather_16bit_weights_on_model_save",
                                          "module_granularity_threshold",
                                          "stage3_module_granularity_threshold",
                                          "use_all_reduce_for_fetch_params",
                                          "stage3_use_all_reduce_for_fetch_params",
                                          "allgather_sequential",
                                          "stage3_allgather_sequential",
                                          "stage3_gather_fp16_weights_on_model_save",
                                          "ignore_unused_parameters",
                                          "legacy_stage1",
                                          "round_robin_gradients",
                                          "zero_hpz_partition_size",
                                          "zero_quantized_weights",
                                          "zero_quantized_nontrainable_weights",
                                          "zero_quantized_gradients",
                                          "zeropp_loco_param",
                                          "mics_shard_size",
                                          "mics_hierarchical_params_gather",
                                          "memory_efficient_linear",
                                          "pipeline_loading_checkpoint",
                                          "override_module_apply",
                                          "log_trace_cache_warnings",
                                          "enable_sanity_checks",
                                          "save_muon_momentum_buffer_in_memory",
                                          "leaf_module"};
// zero/offload_config.py.
constexpr std::string_view kOffloadParamKeys[] = {"device",      "nvme_path",  "buffer_count",
                                                  "buffer_size", "max_in_cpu", "pin_memory"};
constexpr std::string_view kOffloadOptimizerKeys[] = {
    "device",         "nvme_path", "buffer_count", "pin_memory",    "pipeline_read",
    "pipeline_write", "fast_init", "ratio",        "super_offload", "cpuadam_cores_perc"};
// precision_config.py (also pydantic models that forbid unknown keys).
constexpr std::string_view kBf16Keys[] = {"enabled", "immediate_grad_update", "check_grad_overflow",
                                          "bf16_master_weights_and_grads", "bf16_optimizer_states"};
constexpr std::string_view kFp16Keys[] = {"enabled",
                                          "auto_cast",
                                          "loss_scale",
                                          "initial_scale_power",
                                          "loss_scale_window",
                                          "hysteresis",
                                          "consecutive_hysteresis",
                                          "min_loss_scale",
                                          "fp16_master_weights_and_grads"};
// Top-level keys this reader uses, and DeepSpeed's near them: DeepSpeed's top level is a plain
// dict read with .get (config.py), so other keys are ignored there; a near miss is warned about.
constexpr std::string_view kTopKeys[] = {"train_batch_size",
                                         "train_micro_batch_size_per_gpu",
                                         "gradient_accumulation_steps",
                                         "zero_optimization",
                                         "bf16",
                                         "bfloat16",
                                         "fp16",
                                         "amp",
                                         "torch_autocast",
                                         "allgather_size",
                                         "zero_allow_untested_optimizer",
                                         "optimizer",
                                         "data_types"};

void forbid_unknown(const nlohmann::json& obj, Names names, const std::string& where) {
  for (const auto& [key, value] : obj.items()) {
    if (std::find(names.begin(), names.end(), key) != names.end()) continue;
    const std::string_view near = detail::nearest(key, names, key.size() / 3 + 1).name;
    throw ParseError(fmt::format("{}: unknown key '{}'{} (DeepSpeed refuses unknown keys here)", where, key,
                                 near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near)));
  }
}

bool is_auto(const nlohmann::json& obj, const char* field) {
  auto it = obj.find(field);
  return it != obj.end() && it->is_string() && *it == "auto";
}

// The sizes Hugging Face's Trainer fills when they are "auto", by these spellings only
// (integrations/deepspeed.py trainer_config_finalize). An "auto" anywhere else reaches DeepSpeed
// as it is, and DeepSpeed's config validation refuses it.
constexpr std::string_view kFilledWhenAuto[] = {"reduce_bucket_size", "stage3_prefetch_bucket_size",
                                                "stage3_param_persistence_threshold"};

// Whether `field` of zero_optimization is an "auto" Hugging Face fills; an "auto" it does not
// fill is refused, naming the spelling it fills where `field` is DeepSpeed's other one.
bool filled_auto(const nlohmann::json& zero, const char* field, const std::string& zname) {
  if (!is_auto(zero, field)) return false;
  const auto filled = [](std::string_view key) {
    return std::find(std::begin(kFilledWhenAuto), std::end(kFilledWhenAuto), key) != std::end(kFilledWhenAuto);
  };
  if (filled(field)) return true;
  if (const std::string stage3 = "stage3_" + std::string(field); filled(stage3))
    throw ParseError(fmt::format(
        "{}: field '{}' is \"auto\", but Hugging Face's Trainer fills only '{}'; under this spelling DeepSpeed gets "
        "\"auto\" and refuses it",
        zname, field, stage3));
  throw ParseError(fmt::format(
      "{}: field '{}' is \"auto\", which Hugging Face's Trainer does not fill (it fills reduce_bucket_size, "
      "stage3_prefetch_bucket_size and stage3_param_persistence_threshold); DeepSpeed refuses it",
      zname, field));
}

const nlohmann::json* value_at(const nlohmann::json& obj, const char* field) {
  auto it = obj.find(field);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

const nlohmann::json* object_at(const nlohmann::json& obj, const char* field, const std::string& where) {
  const auto* v = value_at(obj, field);
  if (v && !v->is_object())
    throw ParseError(fmt::format("{}: field '{}' must be an object, got {}", where, field, v->dump()));
  return v;
}

// An integer field as pydantic reads it into `int`: whole numbers (5e8 too); fractional values,
// booleans and strings are refused, as are values below `min`. nullopt when absent.
std::optional<std::int64_t> int_at(const nlohmann::json& obj, const char* field, const std::string& where,
                                   std::int64_t min) {
  const auto* v = value_at(obj, field);
  if (!v) return std::nullopt;
  const double d = v->is_number() ? v->get<double>() : std::nan("");
  if (!v->is_number() || !std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 1e15)
    throw ParseError(fmt::format("{}: field '{}' must be a whole number, got {}", where, field, v->dump()));
  const auto i = v->is_number_integer() ? v->get<std::int64_t>() : static_cast<std::int64_t>(d);
  if (i < min)
    throw ParseError(fmt::format("{}: field '{}' must be {}, got {}", where, field,
                                 min == 0 ? "0 or more" : fmt::format("at least {}", min), v->dump()));
  return i;
}

// A boolean as pydantic (lax mode) reads it: true/false, 0/1 and the strings it knows.
std::optional<bool> bool_at(const nlohmann::json& obj, const char* field, const std::string& where) {
  const auto* v = value_at(obj, field);
  if (!v) return std::nullopt;
  if (v->is_boolean()) return v->get<bool>();
  if (v->is_number_integer()) {
    const auto n = v->get<std::int64_t>();
    if (n == 0 || n == 1) return n == 1;
  }
  if (v->is_string()) {
    const std::string s = detail::lower(v->get<std::string>());
    for (const char* t : {"1", "on", "t", "true", "y", "yes"})
      if (s == t) return true;
    for (const char* f : {"0", "off", "f", "false", "n", "no"})
      if (s == f) return false;
  }
  throw ParseError(fmt::format("{}: field '{}' must be true or false, got {}", where, field, v->dump()));
}

enum class Device { none, cpu, nvme };

// offload_optimizer / offload_param: the device; unknown keys refused.
Device offload_device(const nlohmann::json& zero, const char* field, Names keys, const std::string& zname) {
  const auto* o = object_at(zero, field, zname);
  if (!o) return Device::none;
  const std::string where = zname + "." + field;
  forbid_unknown(*o, keys, where);
  const std::string device = tools::get_string_or(*o, "device", "none", where);
  if (device == "none") return Device::none;
  if (device == "cpu") return Device::cpu;
  if (device == "nvme") return Device::nvme;
  throw ParseError(fmt::format("{}: field 'device' must be none, cpu or nvme, got '{}'", where, device));
}

// A batch key: a positive whole number, "auto" (kAuto), or absent (0).
std::int64_t batch_at(const nlohmann::json& j, const char* field, const std::string& name) {
  const auto* v = value_at(j, field);
  if (!v) return 0;
  if (v->is_string() && *v == "auto") return DeepSpeedBatch::kAuto;
  const double d = v->is_number() ? v->get<double>() : std::nan("");
  if (!v->is_number() || !(d >= 1) || d != std::floor(d) || d > 1e15)
    throw ParseError(
        fmt::format("{}: field '{}' must be a positive whole number or \"auto\", got {}", name, field, v->dump()));
  return static_cast<std::int64_t>(d);
}

// Precision from bf16 (or its old name bfloat16) and fp16: DeepSpeed trains in the one enabled,
// in fp32 when neither is (both default to false). "auto" leaves the command's precision.
void apply_precision(const nlohmann::json& j, RunConfig& c, const std::string& name) {
  const char* bf_key = value_at(j, "bf16") ? "bf16" : "bfloat16";  // precision_config.py
  const auto* bf = object_at(j, bf_key, name);
  const auto* fp = object_at(j, "fp16", name);
  if (bf) forbid_unknown(*bf, kBf16Keys, name + "." + bf_key);
  if (fp) forbid_unknown(*fp, kFp16Keys, name + ".fp16");
  if ((bf && is_auto(*bf, "enabled")) || (fp && is_auto(*fp, "enabled"))) return;
  const bool bf_on = bf && bool_at(*bf, "enabled", name + "." + bf_key).value_or(false);
  const bool fp_on = fp && bool_at(*fp, "enabled", name + ".fp16").value_or(false);
  if (bf_on && fp_on)  // config.py: 'bfloat16 and fp16 modes cannot be simultaneously enabled'
    throw ParseError(fmt::format("{}: {}.enabled and fp16.enabled are both true; DeepSpeed allows one", name, bf_key));
  if (bf_on) c.training.precision = Precision::bf16;
  else if (fp_on) c.training.precision = Precision::fp16;
  else {
    c.training.precision = Precision::fp32;
    c.notes.push_back(fmt::format(
        "{}: neither bf16 nor fp16 is enabled, so DeepSpeed trains in fp32; estimated in fp32 (--precision overrides)",
        name));
  }
  if (bf && (bool_at(*bf, "bf16_master_weights_and_grads", name + "." + bf_key).value_or(false) ||
             bool_at(*bf, "bf16_optimizer_states", name + "." + bf_key).value_or(false)))
    c.warnings.push_back(fmt::format(
        "{}: bf16 master weights / optimizer states change the model states; estimated with fp32 ones", name));
}

// data_types.grad_accum_dtype, in DtypeEnum's spellings (config.py; engine.py get_data_types).
std::optional<Precision> grad_accum_dtype(const nlohmann::json& j, const std::string& name) {
  const auto* d = object_at(j, "data_types", name);
  const auto* v = d ? value_at(*d, "grad_accum_dtype") : nullptr;
  if (!v) return std::nullopt;
  static constexpr std::pair<std::string_view, Precision> kNames[] = {{"torch.float32", Precision::fp32},
                                                                      {"fp32", Precision::fp32},
                                                                      {"float32", Precision::fp32},
                                                                      {"float", Precision::fp32},
                                                                      {"torch.bfloat16", Precision::bf16},
                                                                      {"bf16", Precision::bf16},
                                                                      {"bfloat16", Precision::bf16},
                                                                      {"torch.float16", Precision::fp16},
                                                                      {"fp16", Precision::fp16},
                                                                      {"float16", Precision::fp16},
                                                                      {"half", Precision::fp16}};
  if (v->is_string())
    for (const auto& [spelling, precision] : kNames)
      if (*v == spelling) return precision;
  throw ParseError(fmt::format(
      "{}.data_types: field 'grad_accum_dtype' must be fp32, bf16 or fp16 (or DeepSpeed's other spellings of them), "
      "got {}",
      name, v->dump()));
}

// Which step a 16-bit optimizer without ZeRO runs. DeepSpeed wraps a FusedAdam (its own or apex's)
// and its 1-bit Adams in FP16_Optimizer, anything else in FP16_UnfusedOptimizer (engine.py
// _configure_fp16_optimizer, by the optimizer's class). From the config alone: an optimizer
// section of type Adam/AdamW builds FusedAdam unless params.torch_adam (_configure_basic_optimizer);
// without a section the client's optimizer is taken to be unfused (a note says so).
Parallelism::Fp16Step fp16_step(const nlohmann::json& j, const std::string& name) {
  const auto* o = object_at(j, "optimizer", name);
  const auto* type = o ? value_at(*o, "type") : nullptr;
  if (!type) return Parallelism::Fp16Step::unfused;
  if (!type->is_string())
    throw ParseError(fmt::format("{}.optimizer: field 'type' must be a string, got {}", name, type->dump()));
  const std::string t = detail::lower(type->get<std::string>());
  const std::string where = name + ".optimizer";
  const auto* params = object_at(*o, "params", where);
  const bool torch_adam = params && bool_at(*params, "torch_adam", where + ".params").value_or(false);
  const bool fused = ((t == "adam" || t == "adamw") && !torch_adam) || t == "onebitadam" || t == "zerooneadam";
  if (!fused) return Parallelism::Fp16Step::unfused;
  return bool_at(*o, "legacy_fusion", where).value_or(false) ? Parallelism::Fp16Step::fused_legacy
                                                             : Parallelism::Fp16Step::fused;
}

void warn_near_misses(const nlohmann::json& j, RunConfig& c, const std::string& name) {
  for (const auto& [key, value] : j.items()) {
    if (std::find(std::begin(kTopKeys), std::end(kTopKeys), key) != std::end(kTopKeys)) continue;
    const std::string_view near = detail::nearest(key, kTopKeys, std::max<std::size_t>(1, key.size() / 5)).name;
    if (!near.empty())
      c.warnings.push_back(fmt::format("{}: unknown top-level key '{}' ignored (as DeepSpeed does): did you mean '{}'?",
                                       name, key, near));
  }
}

}  // namespace

void apply_deepspeed_config(const std::string& json_text, RunConfig& c, const std::string& name) {
  const auto j = tools::parse_json(json_text, name);
  if (!j.is_object()) throw ParseError(fmt::format("{}: expected a JSON object", name));
  auto& p = c.parallel;
  auto& t = c.training;
  p.accounting = Accounting::deepspeed;
  warn_near_misses(j, c, name);

  DeepSpeedBatch batch;
  batch.file = name;
  batch.train = batch_at(j, "train_batch_size", name);
  batch.micro = batch_at(j, "train_micro_batch_size_per_gpu", name);
  batch.accumulation = batch_at(j, "gradient_accumulation_steps", name);
  if (batch.micro > 0) t.micro_batch = batch.micro;
  if (batch.accumulation > 0) t.grad_accumulation = batch.accumulation;
  // Without any batch key the command's own batch options keep their meaning.
  if (batch.train || batch.micro || batch.accumulation) c.deepspeed_batch = batch;

  apply_precision(j, c, name);
  p.grad_accum_deepspeed = grad_accum_dtype(j, name);
  p.fp16_step_deepspeed = fp16_step(j, name);
  const bool client_optimizer = object_at(j, "optimizer", name) == nullptr;

  const std::string zname = name + ".zero_optimization";
  nlohmann::json zero = nlohmann::json::object();
  if (const auto* z = value_at(j, "zero_optimization")) {
    if (z->is_boolean()) {
      // The deprecated form (zero/config.py read_zero_config_deprecated): true is stage 1.
      zero["stage"] = z->get<bool>() ? 1 : 0;
      c.notes.push_back(fmt::format("{}: \"zero_optimization\": {} is DeepSpeed's deprecated form of stage {}", name,
                                    z->dump(), z->get<bool>() ? 1 : 0));
    } else if (z->is_object()) {
      zero = *z;
    } else {
      throw ParseError(
          fmt::format("{}: field 'zero_optimization' must be an object or true/false, got {}", name, z->dump()));
    }
  }
  forbid_unknown(zero, kZeroKeys, zname);
  if (is_auto(zero, "stage"))
    throw ParseError(fmt::format("{}: field 'stage' must be 0..3, got \"auto\" (only sizes may be auto)", zname));
  const std::int64_t stage = int_at(zero, "stage", zname, 0).value_or(0);
  if (stage > 3) throw ParseError(fmt::format("{}: field 'stage' must be 0..3, got {}", zname, stage));
  p.zero_stage = static_cast<int>(stage);

  // Deprecated spellings DeepSpeed still maps (zero/config.py): cpu_offload → offload_optimizer
  // cpu, cpu_offload_param → offload_param cpu; giving both spellings is refused there too.
  auto legacy = [&](const char* old_key, const char* new_key) {
    const auto v = bool_at(zero, old_key, zname);
    if (v && value_at(zero, new_key))
      throw ParseError(fmt::format("{}: '{}' and '{}' both given; DeepSpeed takes one", zname, old_key, new_key));
    if (v && *v) zero[new_key] = nlohmann::json{{"device", "cpu"}};
  };
  legacy("cpu_offload", "offload_optimizer");
  legacy("cpu_offload_param", "offload_param");
  Device opt_dev = offload_device(zero, "offload_optimizer", kOffloadOptimizerKeys, zname);
  const Device param_dev = offload_device(zero, "offload_param", kOffloadParamKeys, zname);
  if (const auto* o = value_at(zero, "offload_optimizer")) {
    const auto* r = value_at(*o, "ratio");
    if (r && !(r->is_number() && r->get<double>() >= 0.0 && r->get<double>() <= 1.0))
      throw ParseError(fmt::format("{}.offload_optimizer: field 'ratio' must be 0..1, got {}", zname, r->dump()));
    const double ratio = r ? r->get<double>() : 1.0;
    // zero/config.py offload_ratio_check: partial offload is a ZeRO-3 feature.
    if (ratio < 1.0 && stage != 3)
      throw ParseError(fmt::format(
          "{}.offload_optimizer: field 'ratio' {} (partial offload) needs stage 3, got stage {}", zname, ratio, stage));
    if (ratio < 1.0 && opt_dev != Device::none)
      c.notes.push_back(fmt::format("{}: offload_optimizer ratio {} estimated as a full offload", name, ratio));
  }
  // Stage 0 builds no ZeRO optimizer (config.py zero_enabled = stage > 0; engine.py), so nothing
  // is offloaded.
  if (opt_dev != Device::none && stage == 0) {
    c.notes.push_back("deepspeed offload_optimizer does nothing at ZeRO stage 0 (no ZeRO optimizer); ignored");
    opt_dev = Device::none;
  }
  p.offload_optimizer_deepspeed = opt_dev != Device::none;
  p.offload_param_deepspeed = param_dev != Device::none && stage == 3;
  if (param_dev != Device::none && stage != 3)
    c.notes.push_back("deepspeed offload_param applies to ZeRO stage 3 only; ignored");
  if (client_optimizer && stage == 0 && t.precision != Precision::fp32 && !deepspeed_bf16_optimizer(c))
    c.notes.push_back(fmt::format(
        "{}: no optimizer section, so the client's optimizer is counted as DeepSpeed runs a torch one (unfused: 4 "
        "B/param of fp32 gradients in step()); a FusedAdam given as the client's (DeepSpeed's or apex's, as "
        "Megatron-DeepSpeed passes) runs FP16_Optimizer, 8 B/param: add \"optimizer\": {{\"type\": \"AdamW\"}} "
        "to count that",
        name));
  // ZeRO accumulates in another dtype beside the 16-bit gradients (stage_1_and_2.py
  // use_separate_grad_accum); only the BF16_Optimizer's buffer is modelled.
  if (const auto acc = p.grad_accum_deepspeed; acc && stage >= 1 && *acc != t.precision && !deepspeed_bf16_optimizer(c))
    c.warnings.push_back(fmt::format(
        "{}: data_types.grad_accum_dtype {} with {} weights at ZeRO stage {}: ZeRO's separate accumulation buffers "
        "are not modelled",
        name, to_string(*acc), to_string(t.precision), stage));
  if ((opt_dev == Device::nvme) || (p.offload_param_deepspeed && param_dev == Device::nvme))
    c.notes.push_back(
        "deepspeed offload to nvme: the offloaded states are counted in host memory, but live on NVMe (DeepSpeed "
        "keeps pinned host staging buffers)");
  if (const auto* amp = object_at(j, "amp", name);
      amp && bool_at(*amp, "enabled", name + ".amp").value_or(false) && stage > 0)
    throw ParseError(fmt::format("{}: amp.enabled with ZeRO stage {}: DeepSpeed refuses Amp with ZeRO", name, stage));

  for (const char* k :
       {"stage3_max_live_parameters", "max_live_parameters", "stage3_max_reuse_distance", "max_reuse_distance",
        "stage3_param_persistence_threshold", "param_persistence_threshold", "sub_group_size", "allgather_bucket_size"})
    if (!filled_auto(zero, k, zname)) int_at(zero, k, zname, 0);  // checked like DeepSpeed's Field(ge=0)

  // Sizes: DeepSpeed's defaults (zero/config.py), or, for "auto", what Hugging Face's Trainer
  // writes before DeepSpeed sees the config (integrations/deepspeed.py trainer_config_finalize):
  // reduce_bucket_size h², stage3_prefetch_bucket_size 0.9·h².
  const double h = double(c.model.hidden_size);
  auto size = [&](std::initializer_list<const char*> keys, std::int64_t fallback, std::int64_t if_auto) {
    for (const char* k : keys) {
      if (filled_auto(zero, k, zname)) return if_auto;
      if (auto v = int_at(zero, k, zname, 0)) return *v;
    }
    return fallback;
  };
  const std::int64_t reduce = size({"reduce_bucket_size"}, 500000000, std::int64_t(h * h));
  const std::int64_t prefetch =
      size({"stage3_prefetch_bucket_size", "prefetch_bucket_size"}, 50000000, std::int64_t(std::floor(0.9 * h * h)));
  // overlap_comm defaults to true at stage 3 only (overlap_comm_valid); ZeRO-1/2 then allocate a
  // second reduce buffer; without contiguous_gradients there is no reduce buffer.
  const bool overlap = bool_at(zero, "overlap_comm", zname).value_or(stage == 3);
  // ZeRO-1/2 turn contiguous gradients on for an optimizer offload (stage_1_and_2.py:
  // contiguous_gradients or cpu_offload).
  const bool contiguous = bool_at(zero, "contiguous_gradients", zname).value_or(true) ||
                          ((stage == 1 || stage == 2) && opt_dev != Device::none);
  p.reduce_bucket_elements = stage == 0 || !contiguous ? 0 : reduce;
  p.reduce_buffers = (stage == 1 || stage == 2) && overlap ? 2 : 1;
  // ZeRO-1/2 all-gather straight into the flat 16-bit weights (runtime/utils.py
  // all_gather_into_tensor_dp_groups): allgather_bucket_size allocates nothing.
  p.allgather_bucket_elements = stage == 3 ? prefetch : 0;
}

void resolve_deepspeed_batch(RunConfig& c) {
  if (!c.deepspeed_batch) return;
  const DeepSpeedBatch& b = *c.deepspeed_batch;
  auto& t = c.training;
  const std::int64_t dp = c.parallel.dp;
  constexpr std::int64_t kAuto = DeepSpeedBatch::kAuto;
  // "auto" is what Hugging Face's Trainer fills from its own arguments: the command's value.
  std::int64_t M = b.micro == kAuto ? t.micro_batch : b.micro;
  std::int64_t G = b.accumulation == kAuto ? t.grad_accumulation : b.accumulation;
  const std::int64_t T = b.train > 0 ? b.train : 0;
  if (!T && !M) {  // DeepSpeed needs one of the two; the command's micro-batch stands in.
    M = t.micro_batch;
    if (!G) G = t.grad_accumulation;
  }
  if (dp <= 0 || M < 0 || G < 0) return;  // validate() reports these
  // The products are checked: values up to 1e15 each would wrap (and divide by zero below).
  auto product = [&](std::initializer_list<std::int64_t> factors) {
    std::int64_t r = 1;
    for (const std::int64_t f : factors)
      if (__builtin_mul_overflow(r, f, &r))
        throw InvalidArgument(fmt::format("{}: {} × {} × data-parallel size ({}) is beyond any batch", b.file,
                                          b.micro_name, b.accumulation_name, dp));
    return r;
  };
  // config.py _set_batch_related_parameters, then _batch_assertion: train = micro × accum × dp.
  auto refuse = [&](std::int64_t m, std::int64_t g) {
    throw InvalidArgument(fmt::format(
        "{}: {} ({}) is not {} ({}) × {} ({}) × data-parallel size ({}); DeepSpeed refuses it", b.file, b.train_name, T,
        b.micro_name, m ? std::to_string(m) : "derived", b.accumulation_name, g ? std::to_string(g) : "derived", dp));
  };
  if (T && M && G) {
    if (T != product({M, G, dp})) refuse(M, G);
  } else if (T && M) {
    const std::int64_t per_step = product({M, dp});
    if (T % per_step) refuse(M, 0);
    G = T / per_step;
  } else if (T && G) {
    const std::int64_t per_micro = product({G, dp});
    if (T % per_micro) refuse(0, G);
    M = T / per_micro;
  } else if (T) {
    G = 1;
    if (T % dp) refuse(0, G);
    M = T / dp;
  } else if (!G) {
    G = 1;
  }
  t.micro_batch = M;
  t.grad_accumulation = G;
}

}  // namespace stowage::estimate
