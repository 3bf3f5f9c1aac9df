#pragma once
// One swapped storage, as the swap scheduler tracks it from offload() until its host buffer
// goes back to the pool.
#include <cstddef>
#include <cstdint>

#include "stowage/device.hpp"
#include "stowage/storage.hpp"

namespace stowage::offload {

struct SwapEntry {
  enum class Phase {
    out,       // D2H issued (maybe still running); the bytes live in `host`
    coming,    // H2D issued into `incoming`, not yet handed to the compute stream
    resident,  // acquired: the storage has its bytes again; `host` waits for the H2D to finish
  };
  Storage storage;  // keeps the handle while the bytes are away (empty once resident)
  int layer = 0;
  std::uint64_t sequence = 0;  // offload order
  std::size_t nbytes = 0;
  void* host = nullptr;      // from the host pool
  void* incoming = nullptr;  // device block being filled (phase coming)
  Event d2h_done{}, h2d_done{};
  Phase phase = Phase::out;
};

}  // namespace stowage::offload
