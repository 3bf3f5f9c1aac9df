// Uses the installed headers and library: an emulated device, a copy round trip, exit 0 on success.
#include <stowage/device.hpp>

#include <cstdio>
#include <cstring>
#include <vector>
#include "stowage/emulated_device.hpp"

int main() {
  stowage::EmulatedOptions options;
  options.capacity = 16 << 20;
  auto dev = stowage::make_emulated_device(0, options);
  std::vector<unsigned char> in(4096), out(4096);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 7);
  void* p = dev->allocate(in.size());
  dev->copy_async(p, in.data(), in.size(), stowage::CopyKind::host_to_device, stowage::kDefaultStream);
  dev->copy_async(out.data(), p, out.size(), stowage::CopyKind::device_to_host, stowage::kDefaultStream);
  dev->synchronize(stowage::kDefaultStream);
  dev->deallocate(p);
  const bool same = std::memcmp(in.data(), out.data(), in.size()) == 0;
  std::printf("consumer: %s\n", same ? "round trip ok" : "round trip MISMATCH");
  return same ? 0 : 1;
}
