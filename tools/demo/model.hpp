#pragma once
// The demo transformer's shape and where each parameter sits in the flat parameter buffer.
// Pre-norm decoder blocks: x + Attn(RMSNorm(x)), then x + MLP(RMSNorm(x)) with GeLU; a final
// RMSNorm and an untied output projection.
#include <cstdint>
#include <string>
#include <vector>

namespace stowage::demo {

struct ModelShape {
  int layers = 4;
  int hidden = 96;
  int heads = 4;
  int seq = 64;
  int batch = 8;
  int vocab = 0;  // from the tokenizer
  int ffn() const { return 4 * hidden; }
  int tokens() const { return batch * seq; }
  void validate() const;  // InvalidArgument naming the bad field
};

struct ParamInfo {
  std::string name;         // "layer2.w_qkv"
  std::string tag;          // allocator tag of its layer ("layer2.attn")
  std::int64_t offset = 0;  // elements from the start of the flat buffer
  std::int64_t rows = 0, cols = 0;
  std::int64_t numel() const { return rows * cols; }
  bool decay = true;  // weight decay (matrices) or not (norm gains)
};

// Indices into ParameterLayout::params for one block.
struct LayerParams {
  int ln1, w_qkv, w_o, ln2, w_fc1, w_fc2;
};

struct ParameterLayout {
  std::vector<ParamInfo> params;
  std::vector<LayerParams> layers;
  int embedding = -1, ln_f = -1, w_out = -1;
  std::int64_t total = 0;  // elements, including alignment padding
};

// Each parameter starts at a multiple of kParamAlign elements (128 B of bf16), the
// ParameterBucket default, so the flat layout fills a bucket exactly.
inline constexpr std::int64_t kParamAlign = 64;

ParameterLayout make_layout(const ModelShape& shape);

// Initial fp32 values (normal(0, 0.02), output projections scaled by 1/sqrt(2·layers), norm
// gains 1), a pure function of the layout and seed; padding is 0.
std::vector<float> initial_parameters(const ParameterLayout& layout, const ModelShape& shape,
                                      std::uint64_t seed = 1234);

}  // namespace stowage::demo
