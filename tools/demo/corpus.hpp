#pragma once
// The training text: generated deterministically in code (no file to ship), a character-level
// tokenizer, and a deterministic batch sampler.
#include <cstdint>
#include <string>
#include <vector>

namespace stowage::demo {

// About `bytes` characters of simple English sentences from a small grammar, the same on every
// machine for the same seed.
std::string make_corpus(std::size_t bytes, std::uint64_t seed = 2026);

class CharTokenizer {
 public:
  explicit CharTokenizer(const std::string& text);  // the vocabulary: the characters in text
  int vocab_size() const { return static_cast<int>(chars_.size()); }
  std::vector<std::int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<std::int32_t>& ids) const;

 private:
  std::string chars_;
  std::int32_t index_[256];
};

// Input and target token windows for one step: batch rows of `seq` tokens each.
struct Batch {
  std::vector<std::int32_t> inputs, targets;  // batch * seq each
};

// The windows of step `step`, a pure function of (tokens, step, seed): every configuration of
// the demo sees the same data.
Batch sample_batch(const std::vector<std::int32_t>& tokens, int batch, int seq, int step, std::uint64_t seed = 7);

std::uint64_t splitmix64(std::uint64_t& state);

}  // namespace stowage::demo
