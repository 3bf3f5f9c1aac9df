// The estimate's parsers on arbitrary input: a Hugging Face config.json, a DeepSpeed config,
// pasted Megatron-LM arguments and byte sizes. Each either gives a configuration the model
// evaluates, or a stowage::Error — never a crash. The first byte picks the parser.
#include <cstdint>
#include <string>

#include "stowage/byte_size.hpp"
#include "stowage/error.hpp"
#include "tools/estimate/comparison.hpp"
#include "tools/estimate/deepspeed_config.hpp"
#include "tools/estimate/megatron_args.hpp"

using namespace stowage::estimate;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    RunConfig c;
    c.model = preset("llama2-7b");
    switch (data[0] % 4) {
      case 0: c.model = model_from_hf_json(text, "fuzz"); break;
      case 1: apply_deepspeed_config(text, c, "fuzz"); break;
      case 2: apply_megatron_args(text, c); break;
      default: (void)stowage::parse_byte_size(text); return 0;
    }
    finalize(c);
    (void)run_estimate(c);
  } catch (const stowage::Error&) {
  }
  return 0;
}
