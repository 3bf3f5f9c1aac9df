#include "tools/estimate/nearest_argument.hpp"

#include "common/text.hpp"
#include "tools/estimate/argument_spelling.hpp"
#include "tools/estimate/megatron_arg_names.hpp"
#include "tools/estimate/mindspeed_arg_names.hpp"

namespace stowage::estimate {

std::string nearest_launch_argument(std::string_view name) {
  const std::string_view n = without_dashes(name);
  const detail::Nearest megatron = detail::nearest(n, megatron_argument_names(), n.size() / 3);
  const detail::Nearest mindspeed = detail::nearest(n, mindspeed_argument_names(), n.size() / 3);
  const detail::Nearest& found =
      !mindspeed.name.empty() && (megatron.name.empty() || mindspeed.distance < megatron.distance) ? mindspeed
                                                                                                   : megatron;
  return found.name.empty() ? std::string() : "--" + std::string(found.name);
}

}  // namespace stowage::estimate
