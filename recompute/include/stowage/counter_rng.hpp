#pragma once
// A counter-based random generator (Philox4x32-10, Salmon et al., SC'11): random word i of a
// stream is a pure function of (seed, stream, i). A dropout mask drawn from it comes out the
// same when the function is recomputed, in any order and on any thread, with no state to save
// beyond the two numbers in RngState.
#include <array>
#include <cstdint>

namespace stowage {

struct RngState {
  std::uint64_t seed = 0;    // the Philox key
  std::uint64_t stream = 0;  // high half of the counter: one stream per registered function
  bool operator==(const RngState&) const = default;
};

namespace philox {

using Counter = std::array<std::uint32_t, 4>;
using Key = std::array<std::uint32_t, 2>;

// Ten rounds of Philox4x32 (the Random123 reference: its known-answer vectors are tested).
constexpr Counter generate(Counter c, Key k) {
  constexpr std::uint64_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += kW0;
      k[1] += kW1;
    }
    const std::uint64_t p0 = kM0 * c[0], p1 = kM1 * c[2];
    c = {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<std::uint32_t>(p1),
         static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<std::uint32_t>(p0)};
  }
  return c;
}

}  // namespace philox

// Words 4*block .. 4*block+3 of the state's stream.
constexpr std::array<std::uint32_t, 4> random_block(RngState s, std::uint64_t block) {
  return philox::generate({static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                           static_cast<std::uint32_t>(s.stream), static_cast<std::uint32_t>(s.stream >> 32)},
                          {static_cast<std::uint32_t>(s.seed), static_cast<std::uint32_t>(s.seed >> 32)});
}

// Random word i of the stream.
constexpr std::uint32_t random_word(RngState s, std::uint64_t i) { return random_block(s, i / 4)[i % 4]; }

// Uniform in [0, 1) from word i: its top 24 bits, so every value is exact in fp32.
constexpr float random_uniform(RngState s, std::uint64_t i) {
  return static_cast<float>(random_word(s, i) >> 8) * (1.0f / 16777216.0f);
}

}  // namespace stowage
