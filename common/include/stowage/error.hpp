#pragma once
// stowage's exceptions. Every failure a user can cause or meet is one of these; the C ABI turns
// them into a return code or nullptr plus stowage_last_error().
#include <stdexcept>
#include <string>

namespace stowage {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The device (or a cap, or the host) could not provide the memory asked for. Any byte count
// counts, however large: a size no device has (2^62 bytes, SIZE_MAX) is out of memory too, as
// PyTorch's allocator reports it (torch.cuda.OutOfMemoryError).
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// A call whose arguments are wrong: sizes that are no sizes (negative through the C ABI, an
// element count whose byte size overflows, 0 where bytes are required), foreign pointers, double
// frees, destroyed streams or events, mismatched shapes. State is unchanged after it.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// The backend cannot do this (e.g. host-NUMA physical memory on an old driver).
class Unsupported : public Error {
 public:
  using Error::Error;
};

// A device call failed for another reason; the message carries the backend's error name.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// A file or text given to stowage (config, snapshot, event log) is malformed.
class ParseError : public Error {
 public:
  using Error::Error;
};

}  // namespace stowage
