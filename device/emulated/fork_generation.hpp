#pragma once
// How many fork()s lie between the program's start and the calling process: 0 in the process that
// started, 1 in its child, 2 in a grandchild. fork() copies no thread and shares mapped memory, so
// an emulated device made in another generation cannot work in this one (emulated_device.cpp).

namespace stowage::emulated {

unsigned fork_generation();

}  // namespace stowage::emulated
