#pragma once
// The Megatron-LM (and MindSpeed) arguments that change what a training step allocates in ways the
// memory model does not represent: the estimate warns that it ignores them, naming what they keep.
#include <string_view>

namespace stowage::estimate {

// What the argument (spelled with its leading "--") keeps that the estimate does not model; empty
// when the estimate models it or it changes no memory.
std::string_view unmodelled_argument(std::string_view name);

}  // namespace stowage::estimate
