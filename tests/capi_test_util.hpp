#pragma once
// What the C ABI's precision tests share: random fp32 values and the check that a call was refused
// as bad input with a message that says why.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "stowage/stowage.h"

namespace stowage::test {

inline std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// rc is -1, the error is INVALID_ARGUMENT and its message contains `needle`.
inline bool refused(int rc, const char* needle) {
  const std::string e = stowage_last_error();
  EXPECT_EQ(rc, -1);
  EXPECT_EQ(stowage_last_error_code(), STOWAGE_ERROR_INVALID_ARGUMENT) << e;
  EXPECT_NE(e.find(needle), std::string::npos) << e;
  return rc == -1 && e.find(needle) != std::string::npos;
}

}  // namespace stowage::test
