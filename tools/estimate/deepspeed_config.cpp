#include "tools/estimate/deepspeed_config.hpp"

#include <fmt/format.h>

#include "stowage/error.hpp"
#include "tools/common/json_input.hpp"

namespace stowage::estimate {

namespace {

bool is_auto(const nlohmann::json& obj, const char* field) {
  auto it = obj.find(field);
  return it != obj.end() && it->is_string() && *it == "auto";
}

const nlohmann::json* object_at(const nlohmann::json& obj, const char* field, const std::string& what) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return nullptr;
  if (!it->is_object()) throw ParseError(fmt::format("{}: field '{}' must be an object", what, field));
  return &*it;
}

bool offloaded(const nlohmann::json& zero, const char* field, const std::string& what) {
  const auto* o = object_at(zero, field, what);
  if (!o) return false;
  const std::string device = tools::get_string_or(*o, "device", "none", what + "." + field);
  if (device != "none" && device != "cpu" && device != "nvme")
    throw ParseError(fmt::format("{}.{}: field 'device' must be none, cpu or nvme, got '{}'", what, field, device));
  return device != "none";
}

}  // namespace

void apply_deepspeed_config(const std::string& json_text, RunConfig& c, const std::string& name) {
  const auto j = tools::parse_json(json_text, name);
  if (!j.is_object()) throw ParseError(fmt::format("{}: expected a JSON object", name));
  auto& p = c.parallel;
  auto& t = c.training;
  p.accounting = Accounting::deepspeed;
  // DeepSpeed defaults (deepspeed/runtime/zero/config.py): reduce_bucket_size and
  // allgather_bucket_size 5e8 elements.
  p.reduce_bucket_elements = 500000000;
  p.allgather_bucket_elements = 500000000;
  if (!is_auto(j, "train_micro_batch_size_per_gpu"))
    t.micro_batch = tools::get_int_or(j, "train_micro_batch_size_per_gpu", t.micro_batch, name);
  if (!is_auto(j, "gradient_accumulation_steps"))
    t.grad_accumulation = tools::get_int_or(j, "gradient_accumulation_steps", t.grad_accumulation, name);
  if (const auto* bf = object_at(j, "bf16", name);
      bf && !is_auto(*bf, "enabled") && tools::get_bool_or(*bf, "enabled", false, name + ".bf16"))
    t.precision = Precision::bf16;
  if (const auto* fp = object_at(j, "fp16", name);
      fp && !is_auto(*fp, "enabled") && tools::get_bool_or(*fp, "enabled", false, name + ".fp16"))
    t.precision = Precision::fp16;
  const std::string zname = name + ".zero_optimization";
  const auto* zero = object_at(j, "zero_optimization", name);
  if (!zero) {
    p.zero_stage = 0;
    return;
  }
  const auto stage = tools::get_int_or(*zero, "stage", 0, zname);
  if (stage < 0 || stage > 3) throw ParseError(fmt::format("{}: field 'stage' must be 0..3, got {}", zname, stage));
  p.zero_stage = static_cast<int>(stage);
  p.offload_optimizer_deepspeed = offloaded(*zero, "offload_optimizer", zname);
  p.offload_param_deepspeed = offloaded(*zero, "offload_param", zname);
  if (p.offload_param_deepspeed && stage != 3)
    c.notes.push_back("deepspeed offload_param applies to ZeRO stage 3 only; ignored");
  auto bucket = [&](const char* field, std::int64_t fallback) {
    if (is_auto(*zero, field)) return fallback;
    const double v = tools::get_number_or(*zero, field, double(fallback), zname);
    if (!(v >= 0 && v < 1e15))
      throw ParseError(fmt::format("{}: field '{}' must be a non-negative size", zname, field));
    return static_cast<std::int64_t>(v);
  };
  p.reduce_bucket_elements = bucket("reduce_bucket_size", p.reduce_bucket_elements);
  p.allgather_bucket_elements = stage == 3 ? bucket("stage3_prefetch_bucket_size", 50000000)
                                           : bucket("allgather_bucket_size", p.allgather_bucket_elements);
}

}  // namespace stowage::estimate
