#include "tools/demo/corpus.hpp"

#include <array>
#include <stdexcept>

#include "stowage/error.hpp"

namespace stowage::demo {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

namespace {

template <std::size_t N>
const char* pick(const std::array<const char*, N>& words, std::uint64_t& rng) {
  return words[splitmix64(rng) % N];
}

constexpr std::array<const char*, 8> kAdjectives{"old", "quiet", "bright", "small", "heavy", "green", "cold", "kind"};
constexpr std::array<const char*, 10> kNouns{"miller",  "river",   "garden", "sailor", "lantern",
                                             "village", "teacher", "horse",  "window", "baker"};
constexpr std::array<const char*, 8> kVerbs{"watched", "carried", "followed", "painted",
                                            "found",   "mended",  "greeted",  "passed"};
constexpr std::array<const char*, 6> kPlaces{"by the mill",    "in the morning", "near the bridge",
                                             "after the rain", "at the market",  "under the hill"};

}  // namespace

std::string make_corpus(std::size_t bytes, std::uint64_t seed) {
  std::string text;
  text.reserve(bytes + 128);
  std::uint64_t rng = seed;
  while (text.size() < bytes) {
    // "The old miller watched the green river by the mill." -- a grammar with agreement a small
    // model can learn within a few hundred steps.
    std::string s = "the ";
    s += pick(kAdjectives, rng);
    s += ' ';
    s += pick(kNouns, rng);
    s += ' ';
    s += pick(kVerbs, rng);
    s += " the ";
    s += pick(kNouns, rng);
    if (splitmix64(rng) % 2 == 0) {
      s += ' ';
      s += pick(kPlaces, rng);
    }
    s += splitmix64(rng) % 4 == 0 ? ", and " : ". ";
    text += s;
  }
  text.resize(bytes);
  return text;
}

CharTokenizer::CharTokenizer(const std::string& text) {
  bool seen[256] = {};
  for (unsigned char c : text) seen[c] = true;
  for (int c = 0; c < 256; ++c) {
    index_[c] = -1;
    if (seen[c]) {
      index_[c] = static_cast<std::int32_t>(chars_.size());
      chars_ += static_cast<char>(c);
    }
  }
}

std::vector<std::int32_t> CharTokenizer::encode(const std::string& text) const {
  std::vector<std::int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) {
    if (index_[c] < 0) throw InvalidArgument(std::string("demo tokenizer: character not in vocabulary: ") + char(c));
    ids.push_back(index_[c]);
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string s;
  for (auto id : ids) s += chars_.at(static_cast<std::size_t>(id));
  return s;
}

Batch sample_batch(const std::vector<std::int32_t>& tokens, int batch, int seq, int step, std::uint64_t seed) {
  if (tokens.size() < static_cast<std::size_t>(seq) + 2)
    throw InvalidArgument("demo: the corpus is shorter than one sequence");
  Batch b;
  b.inputs.resize(static_cast<std::size_t>(batch) * seq);
  b.targets.resize(b.inputs.size());
  std::uint64_t rng = seed ^ (0xA5A5A5A5ull * static_cast<std::uint64_t>(step + 1));
  const std::size_t span = tokens.size() - static_cast<std::size_t>(seq) - 1;
  for (int r = 0; r < batch; ++r) {
    const std::size_t start = splitmix64(rng) % span;
    for (int t = 0; t < seq; ++t) {
      b.inputs[static_cast<std::size_t>(r) * seq + t] = tokens[start + t];
      b.targets[static_cast<std::size_t>(r) * seq + t] = tokens[start + t + 1];
    }
  }
  return b;
}

}  // namespace stowage::demo
