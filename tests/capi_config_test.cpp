// STOWAGE_* configuration: every variable's parsing, defaults, and ParseError naming the variable.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "stowage/config.hpp"

namespace stowage {
namespace {

Config load(std::map<std::string, std::string> env) {
  return load_config([env = std::move(env)](const char* name) -> const char* {
    static thread_local std::string value;
    auto it = env.find(name);
    if (it == env.end()) return nullptr;
    value = it->second;
    return value.c_str();
  });
}

std::string parse_error_of(std::map<std::string, std::string> env) {
  try {
    load(std::move(env));
  } catch (const ParseError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Config, DefaultsWhenNothingIsSet) {
  Config c = load({});
  EXPECT_EQ(c.log_level, LogLevel::off);
  EXPECT_EQ(c.device, "auto");
  EXPECT_EQ(c.emulated_devices, 1);
  EXPECT_EQ(c.emulated.capacity, std::size_t{8} << 30);
  EXPECT_EQ(c.emulated.link_bandwidth_gbps, 0.0);
  EXPECT_EQ(c.allocator.segments, SegmentMode::expandable);
  EXPECT_EQ(c.event_log, "");
}

TEST(Config, ByteSizes) {
  EXPECT_EQ(parse_byte_size("4096"), 4096u);
  EXPECT_EQ(parse_byte_size("512MiB"), 512u << 20);
  EXPECT_EQ(parse_byte_size("8GiB"), std::size_t{8} << 30);
  EXPECT_EQ(parse_byte_size("8gib"), std::size_t{8} << 30);
  EXPECT_EQ(parse_byte_size("1.5G"), std::size_t{3} << 29);
  EXPECT_EQ(parse_byte_size("2GB"), 2000000000u);
  EXPECT_EQ(parse_byte_size(" 3 KiB "), 3072u);
  EXPECT_EQ(parse_byte_size("1TiB"), std::size_t{1} << 40);
  EXPECT_EQ(parse_byte_size("7b"), 7u);
  EXPECT_THROW(parse_byte_size(""), ParseError);
  EXPECT_THROW(parse_byte_size("MiB"), ParseError);
  EXPECT_THROW(parse_byte_size("-1GiB"), ParseError);
  EXPECT_THROW(parse_byte_size("8 GiBs"), ParseError);
  EXPECT_THROW(parse_byte_size("0.3"), ParseError);  // not whole bytes
  EXPECT_EQ(parse_byte_size("0.5KiB"), 512u);        // a fraction of a unit is fine
  EXPECT_THROW(parse_byte_size("99999999TiB"), ParseError);
  EXPECT_THROW(parse_byte_size("1e3"), ParseError);
}

TEST(Config, LogLevels) {
  EXPECT_EQ(parse_log_level("debug"), LogLevel::debug);
  EXPECT_EQ(parse_log_level("WARNING"), LogLevel::warn);
  EXPECT_EQ(parse_log_level("err"), LogLevel::error);
  EXPECT_EQ(parse_log_level("off"), LogLevel::off);
  EXPECT_THROW(parse_log_level("loud"), ParseError);
}

TEST(Config, EveryVariable) {
  Config c = load({{"STOWAGE_LOG_LEVEL", "info"},
                   {"STOWAGE_DEVICE", "emulated"},
                   {"STOWAGE_EMULATED_DEVICES", "3"},
                   {"STOWAGE_EMULATED_CAPACITY", "512MiB"},
                   {"STOWAGE_EMULATED_LINK_GBPS", "32.5"},
                   {"STOWAGE_ALLOC_CONF", "expandable_segments:False,max_split_size_mb:256"},
                   {"STOWAGE_EVENT_LOG", "/tmp/events.csv"}});
  EXPECT_EQ(c.log_level, LogLevel::info);
  EXPECT_EQ(c.device, "emulated");
  EXPECT_EQ(c.emulated_devices, 3);
  EXPECT_EQ(c.emulated.capacity, 512u << 20);
  EXPECT_EQ(c.emulated.link_bandwidth_gbps, 32.5);
  EXPECT_EQ(c.allocator.segments, SegmentMode::classic);
  EXPECT_EQ(c.allocator.max_split_size, 256u << 20);
  EXPECT_EQ(c.event_log, "/tmp/events.csv");
  EXPECT_EQ(load({{"STOWAGE_DEVICE", "CUDA"}}).device, "cuda");
  EXPECT_EQ(load({{"STOWAGE_DEVICE", "auto"}}).device, "auto");
  EXPECT_EQ(load({{"STOWAGE_DEVICE", " "}}).device, "auto");
}

TEST(Config, AnUnknownDeviceNamesTheBackendsOfThisBuild) {
  EXPECT_NE(parse_error_of({{"STOWAGE_DEVICE", "tpu"}}).find("'tpu' is not one of auto, cuda, emulated"),
            std::string::npos)
      << parse_error_of({{"STOWAGE_DEVICE", "tpu"}});
}

TEST(Config, MalformedValuesNameTheirVariable) {
  const std::map<std::string, std::string> bad[] = {
      {{"STOWAGE_LOG_LEVEL", "chatty"}},          {{"STOWAGE_DEVICE", "tpu"}},
      {{"STOWAGE_EMULATED_DEVICES", "0"}},        {{"STOWAGE_EMULATED_DEVICES", "two"}},
      {{"STOWAGE_EMULATED_CAPACITY", "lots"}},    {{"STOWAGE_EMULATED_CAPACITY", "0"}},
      {{"STOWAGE_EMULATED_LINK_GBPS", "-4"}},     {{"STOWAGE_EMULATED_LINK_GBPS", "fast"}},
      {{"STOWAGE_EMULATED_LINK_GBPS", "1e-300"}}, {{"STOWAGE_EMULATED_LINK_GBPS", "1e9"}},
      {{"STOWAGE_EMULATED_CAPACITY", "200TiB"}},  {{"STOWAGE_ALLOC_CONF", "expandable_segments:maybe"}},
      {{"STOWAGE_EVENT_LOG", "/tmp/x%q.csv"}}};
  for (const auto& env : bad) {
    const std::string& name = env.begin()->first;
    EXPECT_NE(parse_error_of(env).find(name), std::string::npos) << name << " -> " << parse_error_of(env);
  }
}

TEST(Config, MisspeltVariablesAreNamedWithTheClosestKnownOne) {
  const auto w =
      unknown_variable_warnings({"PATH", "STOWAGE_EMULATED_CAPACTY", "STOWAGE_LOG_LEVEL", "STOWAGE_ALOC_CONF",
                                 "STOWAGE_ZZZZZZZZZZZZ", "STOWAGE_BENCH_TOKENS", "STOWAGE_FAULTS_TEST_CHILD"});
  ASSERT_EQ(w.size(), 3u);
  EXPECT_NE(w[0].find("STOWAGE_EMULATED_CAPACTY is not a stowage variable (did you mean STOWAGE_EMULATED_CAPACITY?)"),
            std::string::npos)
      << w[0];
  EXPECT_NE(w[1].find("did you mean STOWAGE_ALLOC_CONF?"), std::string::npos) << w[1];
  EXPECT_NE(w[2].find("STOWAGE_ZZZZZZZZZZZZ is not a stowage variable; it is ignored"), std::string::npos) << w[2];
}

TEST(Config, APyTorchAllocConfParsesWithAWarningPerIgnoredKey) {
  // A PYTORCH_CUDA_ALLOC_CONF value pasted as it is, list value and all.
  const Config c = load({{"STOWAGE_ALLOC_CONF",
                          "expandable_segments:True,roundup_power2_divisions:[256:1,512:2,1024:4,>:8],"
                          "max_split_size_mb:512,backend:native,per_process_memory_fraction:0.5,"
                          "pinned_use_cuda_host_register:True"}});
  EXPECT_EQ(c.allocator.segments, SegmentMode::expandable);
  EXPECT_EQ(c.allocator.max_split_size, 512u << 20);
  EXPECT_EQ(c.allocator.memory_cap_fraction, 0.5);  // PyTorch's fraction is stowage's cap
  ASSERT_EQ(c.warnings.size(), 3u);
  EXPECT_NE(c.warnings[0].find("roundup_power2_divisions:[256:1,512:2,1024:4,>:8] is PyTorch's own setting"),
            std::string::npos)
      << c.warnings[0];
  EXPECT_NE(c.warnings[1].find("backend:native"), std::string::npos) << c.warnings[1];
  EXPECT_NE(c.warnings[2].find("pinned_use_cuda_host_register:True"), std::string::npos) << c.warnings[2];
  EXPECT_TRUE(load({{"STOWAGE_ALLOC_CONF", "max_split_size_mb:512"}}).warnings.empty());
  // PyTorch 2.11's newer keys and the ROCm spellings it takes on CUDA too: each ignored, with its warning.
  const Config newer = load({{"STOWAGE_ALLOC_CONF",
                              "pinned_use_hip_host_register:True,release_lock_on_hipmalloc:True,"
                              "throw_on_cudamalloc_oom:True,pinned_free_catch_all:True,expandable_segments_reserve:0.5,"
                              "expandable_segments_reserve_by_class:[a:0.25,b:8G]"}});
  ASSERT_EQ(newer.warnings.size(), 6u);
  EXPECT_NE(newer.warnings[5].find("expandable_segments_reserve_by_class:[a:0.25,b:8G]"), std::string::npos)
      << newer.warnings[5];
  // Still refused: a key neither knows, and an unclosed list.
  EXPECT_NE(parse_error_of({{"STOWAGE_ALLOC_CONF", "roundup_power2_division:4"}}).find("unknown key"),
            std::string::npos);
  EXPECT_NE(parse_error_of({{"STOWAGE_ALLOC_CONF", "roundup_power2_divisions:[256:1,512:2"}}).find("not closed"),
            std::string::npos);
}

TEST(Config, NamesOfEnums) {
  EXPECT_STREQ(to_string(LogLevel::critical), "critical");
  EXPECT_STREQ(to_string(DeviceKind::cuda), "cuda");
  EXPECT_STREQ(to_string(DeviceKind::emulated), "emulated");
}

}  // namespace
}  // namespace stowage
