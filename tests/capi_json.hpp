#pragma once
// A C ABI text read as JSON: a (device, buf, len) -> length function (stowage_get_stats,
// stowage_snapshot_json, stowage_host_stats), called once for the length and once to fill.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "stowage/stowage.h"

namespace stowage::test {

inline nlohmann::json capi_json(ssize_t (*fn)(int, char*, size_t), int device) {
  const ssize_t n = fn(device, nullptr, 0);
  EXPECT_GT(n, 0) << stowage_last_error();
  std::string buf(static_cast<std::size_t>(n) + 1, '\0');
  EXPECT_EQ(fn(device, buf.data(), buf.size()), n);
  buf.resize(static_cast<std::size_t>(n));
  return nlohmann::json::parse(buf);
}

}  // namespace stowage::test
