#include "tools/estimate/pipeline_layout.hpp"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "stowage/error.hpp"

namespace stowage::estimate {
namespace {

constexpr std::size_t kMaxExpanded = std::size_t{1} << 20;  // letters, once every repeat is written out

std::int64_t repeat_count(std::string_view text, std::size_t& i) {
  const std::size_t start = i;
  std::int64_t n = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9' && n <= (1 << 20)) n = n * 10 + (text[i++] - '0');
  if (i == start || n > (1 << 20))
    throw InvalidArgument(fmt::format("pipeline layout '{}': '*' needs a repeat count (at most 2^20)", text));
  return n;
}

std::string repeated(std::string_view piece, std::int64_t n, std::string_view text) {
  if (piece.size() * std::size_t(n) > kMaxExpanded)
    throw InvalidArgument(
        fmt::format("pipeline layout '{}' is implausibly long once its repeats are written out", text));
  std::string out;
  for (std::int64_t k = 0; k < n; ++k) out += piece;
  return out;
}

// parse_str_to_list: commas dropped, "(…)*n" then "x*n" written out, as Megatron's two regular
// expressions do (a group holds no parentheses).
std::string expand(std::string_view text) {
  std::string s;
  for (char ch : text)
    if (ch != ',') s += ch;
  std::string groups;
  for (std::size_t i = 0; i < s.size();) {
    if (s[i] != '(') {
      groups += s[i++];
      continue;
    }
    const std::size_t close = s.find(')', i + 1);
    if (close == std::string::npos || close == i + 1 || close + 1 >= s.size() || s[close + 1] != '*')
      throw InvalidArgument(fmt::format("pipeline layout '{}': '(' needs a non-empty group closed by ')*n'", text));
    std::size_t at = close + 2;
    groups += repeated(std::string_view(s).substr(i + 1, close - i - 1), repeat_count(s, at), text);
    if (groups.size() > kMaxExpanded)
      throw InvalidArgument(
          fmt::format("pipeline layout '{}' is implausibly long once its repeats are written out", text));
    i = at;
  }
  std::string out;
  for (std::size_t i = 0; i < groups.size();) {
    if (i + 1 < groups.size() && groups[i + 1] == '*') {
      std::size_t at = i + 2;
      out += repeated(std::string_view(groups).substr(i, 1), repeat_count(groups, at), text);
      i = at;
    } else {
      out += groups[i++];
    }
    if (out.size() > kMaxExpanded)
      throw InvalidArgument(
          fmt::format("pipeline layout '{}' is implausibly long once its repeats are written out", text));
  }
  return out;
}

}  // namespace

PipelineLayout parse_pipeline_layout(std::string_view text, std::int64_t pp, std::int64_t num_layers,
                                     std::int64_t mtp_layers) {
  const std::string s = expand(text);
  std::vector<std::string> stages(1);
  for (char ch : s) {
    if (ch == '|') {
      stages.emplace_back();
    } else if (ch == 'E' || ch == 'L' || ch == 't' || ch == 'm') {
      stages.back() += ch;
    } else {
      throw InvalidArgument(fmt::format("pipeline layout '{}': unknown layer '{}' (E, t, m, L)", text, ch));
    }
  }
  const auto n = std::int64_t(stages.size());
  if (pp <= 0 || n % pp != 0)
    throw InvalidArgument(
        fmt::format("pipeline layout '{}': {} stages do not divide over pipeline-parallel {}", text, n, pp));
  // Megatron's checks, in layer order (virtual stage-major, then rank).
  std::string flat;
  for (const auto& st : stages) flat += st;
  auto count = [&](char ch) { return std::int64_t(std::count(flat.begin(), flat.end(), ch)); };
  if (flat.empty() || flat.front() != 'E' || flat.back() != 'L' || count('E') != 1 || count('L') != 1)
    throw InvalidArgument(
        fmt::format("pipeline layout '{}': the embedding (E) must come first and the loss (L) last, once each", text));
  if (count('t') != num_layers)
    throw InvalidArgument(
        fmt::format("pipeline layout '{}' has {} decoder layers (t) for num-layers {}", text, count('t'), num_layers));
  if (count('m') != mtp_layers)
    throw InvalidArgument(
        fmt::format("pipeline layout '{}' has {} MTP layers (m) for mtp-num-layers {}", text, count('m'), mtp_layers));
  if (const auto first_m = flat.find('m'); first_m != std::string::npos && flat.find('t', first_m) != std::string::npos)
    throw InvalidArgument(fmt::format("pipeline layout '{}': decoder layers must come before the MTP layers", text));
  PipelineLayout out;
  out.vpp = n / pp;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto& st = stages[std::size_t(i)];
    out.decoder.push_back(std::int64_t(std::count(st.begin(), st.end(), 't')));
    const auto m = std::int64_t(std::count(st.begin(), st.end(), 'm'));
    if (m == 0) continue;
    if (m != mtp_layers || i / pp != out.vpp - 1)
      throw InvalidArgument(fmt::format(
          "pipeline layout '{}': all MTP layers must be in one rank's last virtual stage (Megatron-LM restricts it)",
          text));
    out.mtp_rank = i % pp;
  }
  return out;
}

}  // namespace stowage::estimate
